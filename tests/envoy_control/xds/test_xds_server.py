"""The ADS gRPC server, driven in-process by a grpc.aio client playing Envoy."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from envoy_control.resources.bootstrap import BOOTSTRAP_CLUSTERS
from envoy_control.resources.build import ListenerSpec, build_resources
from envoy_control.resources.clusters import seconds
from envoy_control.state.replicas import Replica
from envoy_control.xds.cache import SnapshotCache
from envoy_control.xds.server import start_ads_server
from envoy_control.xds.snapshot import CLUSTER, ENDPOINT, LISTENER, ROUTE, Snapshot, new_snapshot
from google.protobuf.message import Message

from modelfleet.config import PlatformConfig

NODE = base_pb2.Node(id="envoy-a", cluster="test")


def snapshot_of(version: str, resources: Mapping[str, Iterable[Message]],
                previous: Snapshot | None = None) -> Snapshot:
    """A snapshot whose routes may name the bootstrap's clusters, as the control plane makes it."""
    return new_snapshot(version, resources, previous, external_clusters=BOOTSTRAP_CLUSTERS)



def request(
    type_url: str, version: str = "", nonce: str = "", names: Sequence[str] = ()
) -> discovery_pb2.DiscoveryRequest:
    return discovery_pb2.DiscoveryRequest(
        type_url=type_url,
        version_info=version,
        response_nonce=nonce,
        resource_names=list(names),
        node=NODE,
    )


def ack(
    resp: discovery_pb2.DiscoveryResponse, names: Sequence[str] = ()
) -> discovery_pb2.DiscoveryRequest:
    return request(resp.type_url, resp.version_info, resp.nonce, names)


def snap(
    config: PlatformConfig, replicas: list[Replica], version: str, previous: Snapshot | None = None
) -> Snapshot:
    return snapshot_of(
        version, build_resources(config, replicas, ListenerSpec("127.0.0.1", 8080)), previous
    )


Call = grpc.aio.StreamStreamCall[discovery_pb2.DiscoveryRequest, discovery_pb2.DiscoveryResponse]


async def _read(call: Call, timeout_s: float = 2.0) -> discovery_pb2.DiscoveryResponse:
    return await asyncio.wait_for(call.read(), timeout_s)


async def test_stream_serves_acks_and_pushes_in_order(
    example_config: PlatformConfig, example_replicas: list[Replica]
) -> None:
    cache = SnapshotCache()
    first = snap(example_config, example_replicas, "1")
    cache.set_snapshot(first)
    server, port = await start_ads_server(cache, "127.0.0.1", 0)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel).StreamAggregatedResources()
            await call.write(request(CLUSTER))
            cds = await _read(call)
            assert (cds.type_url, cds.version_info, len(cds.resources)) == (CLUSTER, "1", 3)
            await call.write(ack(cds))
            clusters = sorted(first.names(CLUSTER))
            await call.write(request(ENDPOINT, names=clusters))
            eds = await _read(call)
            await call.write(ack(eds, clusters))
            await call.write(request(LISTENER))
            lds = await _read(call)
            await call.write(ack(lds))
            await call.write(request(ROUTE, names=["modelfleet-api"]))
            rds = await _read(call)
            await call.write(ack(rds, ["modelfleet-api"]))
            await _until(lambda: cache.status.all_acked(first.versions))

            second = snap(example_config, example_replicas[:-1], "2", first)
            cache.set_snapshot(second)  # a replica left: EDS alone
            eds2 = await _read(call)
            assert (eds2.type_url, eds2.version_info) == (ENDPOINT, "2")
            await call.write(ack(eds2, clusters))

            everything = build_resources(
                example_config, example_replicas[:-1], ListenerSpec("127.0.0.1", 8080)
            )
            for c in everything[CLUSTER]:
                c.connect_timeout.CopyFrom(seconds(2))  # type: ignore[attr-defined]
            third = snapshot_of("3", everything, second)
            cache.set_snapshot(third)  # clusters changed: CDS, then EDS again, nothing else
            pushed = [await _read(call), await _read(call)]
            assert [(r.type_url, r.version_info) for r in pushed] == [
                (CLUSTER, "3"),
                (ENDPOINT, "2"),
            ]
            for r in pushed:
                await call.write(ack(r, clusters if r.type_url == ENDPOINT else ()))
            await _until(lambda: cache.status.all_acked(third.versions))
            with pytest.raises(asyncio.TimeoutError):
                await _read(call, 0.2)  # LDS and RDS did not change: not resent
            node = cache.status.node("envoy-a")
            assert node is not None and node.streams == 1
        await _until(lambda: node.streams == 0)
        assert cache.watchers == 0
    finally:
        await server.stop(0)


async def test_delta_is_not_served() -> None:
    server, port = await start_ads_server(SnapshotCache(), "127.0.0.1", 0)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel).DeltaAggregatedResources()
            await call.write(discovery_pb2.DeltaDiscoveryRequest(type_url=CLUSTER))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call.read()
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        await server.stop(0)


async def _until(condition: object, timeout_s: float = 2.0) -> None:
    assert callable(condition)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)
