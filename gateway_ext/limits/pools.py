"""The pools gateway_ext admits to, built from the config (pure).

One :class:`~gateway_ext.limits.admission.PoolAdmission` per declared, not retired ``model@version``,
the pools of one model sharing one :class:`~gateway_ext.limits.concurrency.TeamConcurrency` (a team's
``max_concurrency`` counts across the live and canary versions). Capacity in tokens in flight:
the version's load-tested ``capacity.tokens_in_flight`` per replica x its replicas. Until the
control plane's router state feeds live replica counts, they come from the config's
``local.replicas`` (what ``modelfleet up`` starts) or an override.

A version the control plane serves but this gateway's config does not declare (registered later
through the admin API) gets its pool when the router state first lists it
(:func:`with_state_pool`): shaped like its model's other pools, its capacity from the state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from gateway_ext.limits.admission import PoolAdmission, pool_capacity_tokens
from gateway_ext.limits.admission_types import AdmissionConfig
from gateway_ext.limits.bucket_store import reservation_ttl_s
from gateway_ext.limits.concurrency import TeamConcurrency
from modelfleet.config.local_plan import replica_counts
from modelfleet.config.schema import PlatformConfig, Tier


def served_versions(config: PlatformConfig) -> list[str]:
    """``model@version`` of every declared version that is not retired."""
    return [v.key for v in config.versions if v.status != "retired"]


def replicas_per_version(config: PlatformConfig,
                         override: Mapping[str, int] | None = None) -> dict[str, int]:
    """Serving replicas per ``model@version``: ``override`` where it names a version, else the
    local stack's count (0 for a version it does not start)."""
    counts = replica_counts(config)
    out = {key: counts.get(key, 0) for key in served_versions(config)}
    out.update({k: v for k, v in (override or {}).items() if k in out})
    return out


def pool_capacities(config: PlatformConfig, replicas: Mapping[str, int]) -> dict[str, int]:
    """Capacity per pool in tokens in flight (load-tested tokens in flight x ``replicas``)."""
    out = {}
    for version in config.versions:
        if version.status != "retired":
            out[version.key] = pool_capacity_tokens(version.capacity.tokens_in_flight,
                                                    replicas.get(version.key, 0))
    return out


def make_pools(config: PlatformConfig, capacities: Mapping[str, int], max_queue: int,
               queue_timeout_s: Mapping[Tier, float | None]) -> dict[str, PoolAdmission]:
    """One admission state per pool in ``capacities`` (tokens in flight). Admitted requests never
    released are dropped when their reservation would expire (``reservation_ttl_s``)."""
    shared: dict[str, TeamConcurrency] = {}
    pools = {}
    for key, capacity in capacities.items():
        model_name = key.partition("@")[0]
        model = config.model(model_name)
        ttl = reservation_ttl_s(model.max_output_tokens if model else 4096)
        admission = AdmissionConfig(max_queue=max_queue, queue_timeout_s=dict(queue_timeout_s),
                                    in_flight_ttl_s=ttl)
        concurrency = shared.setdefault(model_name, TeamConcurrency())
        pools[key] = PoolAdmission(capacity, admission, concurrency)
    return pools


def with_state_pool(pools: Mapping[str, PoolAdmission], config: PlatformConfig, key: str,
                    capacity_tokens: int) -> dict[str, PoolAdmission] | None:
    """``pools`` plus an admission pool for ``key`` (``model@version``, a version this gateway's
    config does not declare) holding ``capacity_tokens`` tokens in flight; None when the model
    itself is unknown here (no team may use it) or no pool exists to copy the queue settings
    from. The new pool takes a sibling's settings (queue bound and timeouts) and shares its
    team concurrency: a team's ``max_concurrency`` still counts across the model's versions."""
    model_name = key.partition("@")[0]
    model = config.model(model_name)
    if model is None or key in pools or not pools:
        return None
    sibling = next((p for k, p in sorted(pools.items()) if k.partition("@")[0] == model_name),
                   None)
    template = sibling if sibling is not None else next(iter(pools.values()))
    admission = replace(template.config,
                        in_flight_ttl_s=reservation_ttl_s(model.max_output_tokens))
    concurrency = sibling.concurrency if sibling is not None else TeamConcurrency()
    return {**pools, key: PoolAdmission(capacity_tokens, admission, concurrency)}
