"""The state-of-the-world protocol of one stream, driven with hand-made requests (no transport)."""

from __future__ import annotations

from collections.abc import Sequence

from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2
from envoy_control.resources.build import ListenerSpec, build_resources
from envoy_control.resources.clusters import seconds
from envoy_control.state.replicas import Replica
from envoy_control.xds.snapshot import CLUSTER, ENDPOINT, LISTENER, ROUTE, Snapshot, new_snapshot
from envoy_control.xds.sotw import SotwStream
from envoy_control.xds.status import XdsStatus
from google.rpc import status_pb2

from modelfleet.config import PlatformConfig

NODE = base_pb2.Node(id="envoy-a", cluster="test")


def request(
    type_url: str,
    version: str = "",
    nonce: str = "",
    names: Sequence[str] = (),
    error: str | None = None,
) -> discovery_pb2.DiscoveryRequest:
    req = discovery_pb2.DiscoveryRequest(
        type_url=type_url,
        version_info=version,
        response_nonce=nonce,
        resource_names=list(names),
        node=NODE,
    )
    if error is not None:
        req.error_detail.CopyFrom(status_pb2.Status(code=3, message=error))
    return req


def ack(
    resp: discovery_pb2.DiscoveryResponse, names: Sequence[str] = ()
) -> discovery_pb2.DiscoveryRequest:
    return request(resp.type_url, resp.version_info, resp.nonce, names)


def snap(
    config: PlatformConfig, replicas: list[Replica], version: str, previous: Snapshot | None = None
) -> Snapshot:
    return new_snapshot(
        version, build_resources(config, replicas, ListenerSpec("127.0.0.1", 8080)), previous
    )


def connected(
    config: PlatformConfig, replicas: list[Replica]
) -> tuple[SotwStream, XdsStatus, Snapshot, list[str]]:
    """A stream that went through the initial exchange and ACKed everything."""
    status = XdsStatus(clock=lambda: 1000.0)
    stream = SotwStream(status, stream_id=1)
    first = snap(config, replicas, "1")
    (cds,) = stream.on_request(request(CLUSTER), first)
    (lds,) = stream.on_request(request(LISTENER), first)
    assert stream.on_request(ack(cds), first) == []
    clusters = sorted(first.names(CLUSTER))
    (eds,) = stream.on_request(request(ENDPOINT, names=clusters), first)
    assert stream.on_request(ack(eds, clusters), first) == []
    assert stream.on_request(ack(lds), first) == []
    (rds,) = stream.on_request(request(ROUTE, names=["modelfleet-api"]), first)
    assert stream.on_request(ack(rds, ["modelfleet-api"]), first) == []
    return stream, status, first, clusters


def test_initial_exchange_is_acked(
    example_config: PlatformConfig, example_replicas: list[Replica]
) -> None:
    stream, status, first, _ = connected(example_config, example_replicas)
    node = status.node("envoy-a")
    assert node is not None and node.streams == 1 and node.cluster == "test"
    assert status.all_acked(first.versions)
    assert all(node.of(t).acked_version == "1" for t in (CLUSTER, ENDPOINT, LISTENER, ROUTE))
    stream.close()
    assert node.streams == 0


def test_only_changed_types_are_pushed(
    example_config: PlatformConfig, example_replicas: list[Replica]
) -> None:
    stream, _, first, _ = connected(example_config, example_replicas)
    second = snap(example_config, example_replicas[:-1], "2", first)  # a replica left: EDS only
    pushed = stream.on_snapshot(second)
    assert [(r.type_url, r.version_info) for r in pushed] == [(ENDPOINT, "2")]
    assert stream.on_snapshot(second) == []  # the same snapshot again: nothing to send


def test_push_order_and_eds_after_cds(
    example_config: PlatformConfig, example_replicas: list[Replica]
) -> None:
    stream, _, first, _ = connected(example_config, example_replicas)
    everything = build_resources(example_config, example_replicas, ListenerSpec("127.0.0.1", 9090))
    for cluster in everything[CLUSTER]:
        cluster.connect_timeout.CopyFrom(seconds(3))  # type: ignore[attr-defined]
    second = new_snapshot(
        "2", everything, first
    )  # clusters and listener changed, endpoints did not
    assert second.versions[ENDPOINT] == "1"
    pushed = stream.on_snapshot(second)
    assert [(r.type_url, r.version_info) for r in pushed] == [
        (CLUSTER, "2"),
        (ENDPOINT, "1"),
        (LISTENER, "2"),
    ]
    # EDS went out again at its unchanged version so the re-warming clusters get their assignments.


def test_eds_push_carries_new_clusters_assignments(
    example_config: PlatformConfig, example_replicas: list[Replica]
) -> None:
    stream, _, first, _ = connected(example_config, example_replicas)
    fewer = example_config.model_copy(
        update={"versions": example_config.versions[:2], "models": example_config.models[:1]}
    )
    start = snap(fewer, example_replicas, "2", first)
    stream.on_snapshot(start)
    grown = snap(example_config, example_replicas, "3", start)  # reason-70b@v1 added back
    pushed = stream.on_snapshot(grown)
    eds = next(r for r in pushed if r.type_url == ENDPOINT)
    assert (
        len(eds.resources) == 3
    )  # includes the new cluster's, though the stream asked for 2 names


def test_stale_nonce_is_ignored(
    example_config: PlatformConfig, example_replicas: list[Replica]
) -> None:
    stream, status, first, clusters = connected(example_config, example_replicas)
    second = snap(example_config, example_replicas[:-1], "2", first)
    (eds,) = stream.on_snapshot(second)
    node = status.node("envoy-a")
    assert node is not None
    stale = request(ENDPOINT, "1", "1-1", clusters)  # answers an older response
    assert stream.on_request(stale, second) == []
    assert node.of(ENDPOINT).acked_version == "1"
    stream.on_request(ack(eds, clusters), second)
    assert node.of(ENDPOINT).acked_version == "2"


def test_nack_is_recorded_and_not_resent(
    example_config: PlatformConfig, example_replicas: list[Replica]
) -> None:
    stream, status, first, _ = connected(example_config, example_replicas)
    second = snap(example_config, example_replicas[:-1], "2", first)
    (eds,) = stream.on_snapshot(second)
    nack = request(ENDPOINT, "1", eds.nonce, ["chat-7b@v13"], error="bad endpoint, said Envoy")
    assert stream.on_request(nack, second) == []  # the rejected version is not sent again
    st = status.node("envoy-a").of(ENDPOINT)  # type: ignore[union-attr]
    assert st.acked_version == "1" and st.nack_count == 1
    assert st.last_nack is not None and st.last_nack.version == "2"
    assert st.last_nack.message == "bad endpoint, said Envoy"
    assert not status.all_acked(second.versions)
    third = snap(example_config, example_replicas, "3", second)  # the next change is pushed
    assert [r.version_info for r in stream.on_snapshot(third)] == ["3"]


def test_unsubscribed_types_are_not_pushed(
    example_config: PlatformConfig, example_replicas: list[Replica]
) -> None:
    status = XdsStatus()
    stream = SotwStream(status, stream_id=7)
    first = snap(example_config, example_replicas, "1")
    (cds,) = stream.on_request(request(CLUSTER), first)
    second = snap(example_config, example_replicas[:-1], "2", first)
    assert stream.on_snapshot(second) == []  # no EDS subscription yet, CDS unchanged
    (eds,) = stream.on_request(request(ENDPOINT, names=["chat-7b@v13"]), second)
    assert eds.version_info == "2" and eds.nonce.startswith("7-")
    stream.on_request(request(ENDPOINT, "2", eds.nonce, names=[]), second)  # unsubscribes
    assert stream.on_snapshot(snap(example_config, example_replicas, "3", second)) == []
    assert cds.version_info == "1"


def test_no_snapshot_yet_means_no_answer() -> None:
    stream = SotwStream(XdsStatus(), stream_id=1)
    assert stream.on_request(request(CLUSTER), None) == []
    assert stream.on_request(request("type.googleapis.com/unknown.Type"), None) == []
