"""Snapshots: per-type versions that only move when a type's resources change, and the
consistency check that refuses a snapshot with dangling references."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.route.v3 import route_pb2
from envoy_control.resources.bootstrap import BOOTSTRAP_CLUSTERS
from envoy_control.resources.build import ListenerSpec, build_resources
from envoy_control.resources.clusters import make_cluster, make_load_assignment
from envoy_control.resources.listeners import make_listener
from envoy_control.resources.routes import AliasRoute, make_route_config
from envoy_control.state.replicas import Replica
from envoy_control.xds.cache import SnapshotCache
from envoy_control.xds.consistency import (
    InconsistentSnapshot,
    check_consistent,
    consistency_problems,
)
from envoy_control.xds.snapshot import (
    CLUSTER,
    ENDPOINT,
    LISTENER,
    ROUTE,
    Snapshot,
    new_snapshot,
    same_resources,
)
from google.protobuf.message import Message

from modelfleet.config import PlatformConfig


def snapshot_of(version: str, resources: Mapping[str, Iterable[Message]],
                previous: Snapshot | None = None) -> Snapshot:
    """A snapshot whose routes may name the bootstrap's clusters, as the control plane makes it."""
    return new_snapshot(version, resources, previous, external_clusters=BOOTSTRAP_CLUSTERS)



def _resources(config: PlatformConfig, replicas: list[Replica]) -> dict[str, list[Message]]:
    return build_resources(config, replicas, ListenerSpec("127.0.0.1", 8080))


def test_built_snapshot_is_consistent(
    example_config: PlatformConfig, example_replicas: list[Replica]
) -> None:
    snap = snapshot_of("1", _resources(example_config, example_replicas))
    assert consistency_problems(snap) == []
    assert dict(snap.versions) == {CLUSTER: "1", ENDPOINT: "1", LISTENER: "1", ROUTE: "1"}


def test_unchanged_types_keep_their_version(
    example_config: PlatformConfig, example_replicas: list[Replica]
) -> None:
    first = snapshot_of("1", _resources(example_config, example_replicas))
    second = snapshot_of(
        "2", _resources(example_config, example_replicas[:-1]), first
    )  # a replica left
    assert second.versions[ENDPOINT] == "2"
    assert (second.versions[CLUSTER], second.versions[LISTENER], second.versions[ROUTE]) == (
        "1",
        "1",
        "1",
    )
    third = snapshot_of(
        "3", _resources(example_config, list(reversed(example_replicas[:-1]))), second
    )
    assert same_resources(second, third)  # order of registration does not matter


def test_snapshot_is_isolated_from_later_edits(example_config: PlatformConfig) -> None:
    resources = _resources(example_config, [])
    snap = snapshot_of("1", resources)
    cluster = resources[CLUSTER][0]
    assert isinstance(cluster, cluster_pb2.Cluster)
    cluster.name = "edited-after-publish"
    assert "edited-after-publish" not in snap.names(CLUSTER)


def test_duplicate_names_are_refused() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        snapshot_of("1", {CLUSTER: [make_cluster("a@v1"), make_cluster("a@v1")]})


def _minimal(
    clusters: list[str], assignments: list[str], route_to: list[str], rds: str = "modelfleet-api"
) -> dict[str, list[Message]]:
    return {
        CLUSTER: [make_cluster(c) for c in clusters],
        ENDPOINT: [make_load_assignment(a, []) for a in assignments],
        LISTENER: [make_listener("127.0.0.1", 8080, route_config_name=rds)],
        ROUTE: [
            make_route_config(
                [AliasRoute(model=k.split("@")[0], live=k) for k in route_to], route_to
            )
        ],
    }


def test_consistency_catches_every_dangling_reference() -> None:
    ok = snapshot_of("1", _minimal(["m@v1"], ["m@v1"], ["m@v1"]))
    assert check_consistent(ok) is ok

    missing_cla = snapshot_of("2", _minimal(["m@v1", "m@v2"], ["m@v1"], ["m@v1"]))
    assert consistency_problems(missing_cla) == ["cluster m@v2 has no ClusterLoadAssignment m@v2"]

    orphan_cla = snapshot_of("3", _minimal(["m@v1"], ["m@v1", "old@v0"], ["m@v1"]))
    assert consistency_problems(orphan_cla) == [
        "ClusterLoadAssignment old@v0 belongs to no EDS cluster"
    ]

    bad_route = snapshot_of("4", _minimal(["m@v1"], ["m@v1"], ["m@v1", "gone@v9"]))
    problems = consistency_problems(bad_route)
    assert problems and all("gone@v9, which is missing" in p for p in problems)

    bad_rds = snapshot_of("5", _minimal(["m@v1"], ["m@v1"], ["m@v1"], rds="elsewhere"))
    assert consistency_problems(bad_rds) == [
        "listener modelfleet-api uses route configuration elsewhere, which is missing"
    ]


def test_cache_refuses_inconsistent_snapshot_and_keeps_serving() -> None:
    cache = SnapshotCache()
    seen: list[str] = []
    cache.watch(lambda s: seen.append(s.version))
    good = snapshot_of("1", _minimal(["m@v1"], ["m@v1"], ["m@v1"]))
    cache.set_snapshot(good)
    bad = snapshot_of("2", _minimal(["m@v1"], ["m@v1"], ["m@v1", "gone@v9"]), good)
    with pytest.raises(InconsistentSnapshot) as err:
        cache.set_snapshot(bad)
    assert err.value.problems
    assert cache.snapshot is good and seen == ["1"]


def test_mirror_and_weighted_targets_are_checked() -> None:
    resources = _minimal(["m@v1"], ["m@v1"], [])
    resources[ROUTE] = [
        make_route_config(
            [
                AliasRoute(
                    "m", "m@v1", canary="m@v2", canary_percent=5, shadow="m@v3", shadow_fraction=0.1
                )
            ],
            [],
        )
    ]
    problems = consistency_problems(snapshot_of("1", resources))
    assert any("m@v2" in p for p in problems) and any(
        "(mirror)" in p and "m@v3" in p for p in problems
    )
    assert isinstance(resources[ROUTE][0], route_pb2.RouteConfiguration)
