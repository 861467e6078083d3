"""What a region must hold, from the capacity plan (``sim/plan.py``), checked before any
resource is declared (pure functions).

Each region carries the whole peak alone. The plan's demand per model (peak streams x tokens per
second per stream) divided by the *live* version's load-tested output tokens per second gives the
replicas one region needs (the seed: 12 chat-7b, 3 reason-70b). The live version's pool must
allow at least that many (``max_replicas``); canary pools are extra capacity on top and are not
counted. Models the plan does not know are not checked.

Warm headroom (docs/autoscaling.md): placeholder replicas that hold running GPU nodes for one
cold start of load growth at peak, ``ceil(replicas x (growth - 1))`` with ``growth`` the plan's
load growth over the cold-start plan (1.05^6 = 1.34): 5 chat-7b and 2 reason-70b replicas.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from modelfleet.config.schema import PlatformConfig, Pool, Version
from sim.plan import ModelLoad, PlanInputs, plan, replicas_for


class CapacityError(ValueError):
    """A region's pools cannot carry the planned peak."""


@dataclass(frozen=True)
class ModelNeed:
    """One model's peak in one region: replicas of its live version (and their GPU shape)."""

    model: str
    live: Version
    peak_replicas: int
    warm_replicas: int


@dataclass(frozen=True)
class GpuDemand:
    """GPUs of one ``gpu_type`` a region's pools ask for: at their warm minima, at their maxima,
    and held warm by placeholders."""

    gpu_type: str
    min_gpus: int
    max_gpus: int
    warm_gpus: int


def _loads(inputs: PlanInputs) -> dict[str, ModelLoad]:
    return {load.name: load for load in (inputs.chat, inputs.reasoning)}


def model_needs(config: PlatformConfig, inputs: PlanInputs | None = None) -> dict[str, ModelNeed]:
    """Replicas per region at peak for every planned model, sized on its live version."""
    inputs = inputs or PlanInputs()
    growth = plan(inputs).load_growth_during_cold_start
    needs: dict[str, ModelNeed] = {}
    for name, load in _loads(inputs).items():
        model = config.model(name)
        live = config.version(name, model.live) if model else None
        if live is None:
            continue
        sized = dataclasses.replace(load, replica_tokens_per_s=live.capacity.output_tokens_per_s,
                                    gpus_per_replica=live.gpus_per_replica)
        peak = replicas_for(sized)
        needs[name] = ModelNeed(name, live, peak, math.ceil(peak * (growth - 1) - 1e-9))
    return needs


def region_pools(config: PlatformConfig, region: str) -> list[tuple[Pool, Version]]:
    """The pools of ``region`` with their versions; ``ValueError`` for an undeclared version."""
    out = []
    for pool in config.pools:
        if pool.region != region:
            continue
        version = config.version(pool.model, pool.version)
        if version is None:
            raise ValueError(f"pool {pool.key} in {region} names an undeclared version")
        out.append((pool, version))
    return out


def check_pool_maxima(config: PlatformConfig, region: str,
                      inputs: PlanInputs | None = None) -> dict[str, ModelNeed]:
    """Raise :class:`CapacityError` (every shortfall listed) unless the live version's pool of
    each planned model allows the plan's peak replicas in ``region``; return the needs."""
    needs = model_needs(config, inputs)
    problems = []
    pools = {(p.model, p.version): p for p, _ in region_pools(config, region)}
    for need in needs.values():
        pool = pools.get((need.model, need.live.version))
        if pool is None:
            problems.append(f"{region}: no pool of {need.live.key}, the live version of "
                            f"{need.model}; the capacity plan needs {need.peak_replicas} replicas")
        elif pool.max_replicas < need.peak_replicas:
            problems.append(
                f"{region}: pool {pool.key} has max_replicas {pool.max_replicas}, below the "
                f"capacity plan's {need.peak_replicas} replicas of {need.model} at peak "
                f"(each region carries the whole peak alone; sim/plan.py)")
    if problems:
        raise CapacityError("the pools cannot carry the planned peak:\n  " + "\n  ".join(problems))
    return needs


def gpu_demand(config: PlatformConfig, region: str,
               needs: dict[str, ModelNeed]) -> dict[str, GpuDemand]:
    """GPUs per ``gpu_type`` the pools of ``region`` ask for, warm placeholders included."""
    out: dict[str, GpuDemand] = {}
    for pool, version in region_pools(config, region):
        d = out.get(version.gpu_type, GpuDemand(version.gpu_type, 0, 0, 0))
        g = version.gpus_per_replica
        out[version.gpu_type] = dataclasses.replace(
            d, min_gpus=d.min_gpus + pool.min_replicas * g, max_gpus=d.max_gpus + pool.max_replicas * g)
    for need in needs.values():
        gpu_type = need.live.gpu_type
        if gpu_type in out and need.warm_replicas:
            d = out[gpu_type]
            out[gpu_type] = dataclasses.replace(
                d, warm_gpus=d.warm_gpus + need.warm_replicas * need.live.gpus_per_replica)
    return out
