"""Cross-checks of a config that no single record can make (pure functions).

Each check takes the config and where its items came from and returns findings; nothing here
reads files.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable

from modelfleet.config.hardware import (
    GB,
    GPU_TYPES,
    MIN_KV_FRACTION,
    kv_bytes_per_token,
    kv_cache_bytes,
    weights_bytes,
)
from modelfleet.config.keyhash import hash_key
from modelfleet.config.problems import Origins, Problem
from modelfleet.config.schema import PlatformConfig, Version

Check = Callable[[PlatformConfig, Origins], Iterable[Problem]]


def _duplicates(cfg: PlatformConfig, where: Origins) -> Iterable[Problem]:
    keyed: dict[str, list[str]] = {
        "models": [m.name for m in cfg.models],
        "versions": [v.key for v in cfg.versions],
        "pools": [f"{p.key} in {p.region}" for p in cfg.pools],
        "teams": [t.name for t in cfg.teams],
        "regions": list(cfg.regions),
    }
    for section, keys in keyed.items():
        seen: set[str] = set()
        for i, key in enumerate(keys):
            if key in seen:
                yield Problem(where.of(section, i).at(), f"{key} is declared more than once")
            seen.add(key)


def _aliases(cfg: PlatformConfig, where: Origins) -> Iterable[Problem]:
    for i, m in enumerate(cfg.models):
        at = where.of("models", i).at
        declared = {v.version: v for v in cfg.versions_of(m.name)}
        live = declared.get(m.live)
        if live is None:
            yield Problem(at("live"), f"alias names {m.name}@{m.live}, which is not a declared version")
        elif live.status == "retired":
            yield Problem(at("live"), f"alias names {m.name}@{m.live}, which is retired")
        for stage, target in (("canary", m.canary), ("shadow", m.shadow)):
            if target is None:
                continue
            if target.version not in declared:
                yield Problem(at(stage, "version"), f"{m.name}@{target.version} is not a declared version")
            elif target.version == m.live:
                yield Problem(at(stage, "version"), f"{stage} version is the live version {m.live}")
            elif declared[target.version].status == "retired":
                yield Problem(at(stage, "version"), f"{m.name}@{target.version} is retired")
    names = {m.name for m in cfg.models}
    for i, v in enumerate(cfg.versions):
        if v.model not in names:
            yield Problem(where.of("versions", i).at("model"), f"model {v.model!r} is not declared")


def _pools(cfg: PlatformConfig, where: Origins) -> Iterable[Problem]:
    keys = {v.key for v in cfg.versions}
    for i, p in enumerate(cfg.pools):
        at = where.of("pools", i).at
        if p.key not in keys:
            yield Problem(at("version"), f"pool names {p.key}, which is not a declared version")
        if cfg.regions and p.region not in cfg.regions:
            yield Problem(at("region"), f"region {p.region!r} is not in regions {list(cfg.regions)}")
        if p.min_replicas > p.max_replicas:
            yield Problem(at("min_replicas"), f"min_replicas {p.min_replicas} > max_replicas {p.max_replicas}")


def _teams(cfg: PlatformConfig, where: Origins) -> Iterable[Problem]:
    names = {m.name for m in cfg.models}
    shares: dict[str, float] = defaultdict(float)
    holders: dict[str, list[tuple[int, int]]] = defaultdict(list)
    key_owner: dict[str, str] = {}
    for i, t in enumerate(cfg.teams):
        at = where.of("teams", i).at
        for j, lim in enumerate(t.limits):
            if lim.model not in names:
                yield Problem(at("limits", j, "model"), f"model {lim.model!r} is not declared")
            shares[lim.model] += lim.guaranteed_share
            holders[lim.model].append((i, j))
        for model, n in Counter(lim.model for lim in t.limits).items():
            if n > 1:
                yield Problem(at("limits"), f"limits for {model} are declared {n} times")
        for k, h in enumerate(t.key_hashes):
            if h in key_owner and key_owner[h] != t.name:
                yield Problem(at("key_hashes", k), f"key hash also belongs to team {key_owner[h]}")
            key_owner[h] = t.name
    for model, total in shares.items():
        if total > 1 + 1e-9:
            i, j = holders[model][-1]
            yield Problem(
                where.of("teams", i).at("limits", j, "guaranteed_share"),
                f"guaranteed shares of {model} sum to {total:.2f}, more than 1",
            )


def memory_findings(v: Version) -> list[tuple[str, str, str]]:
    """Does ``v`` fit its GPUs? Returns (severity, field, message) triples; empty if it fits.

    Weights at the version's precision plus a useful KV cache (see ``MIN_KV_FRACTION``) must fit
    in ``gpus_per_replica`` GPUs, and the load-tested tokens in flight must fit the KV cache.
    """
    gpu = GPU_TYPES[v.gpu_type]
    arch = v.architecture
    total = gpu.memory_bytes * v.gpus_per_replica
    weights = weights_bytes(arch.params_billion, v.precision)
    kv = kv_cache_bytes(gpu, v.gpus_per_replica, weights, v.engine_config.gpu_memory_utilization)
    out: list[tuple[str, str, str]] = []
    where = f"{v.gpus_per_replica} x {gpu.name}"
    if kv < MIN_KV_FRACTION * total:
        left = max(kv, 0) / GB
        out.append((
            "error",
            "gpus_per_replica",
            f"{arch.params_billion:g}B at {v.precision} is {weights / GB:.0f} GB of weights; on {where} "
            f"that leaves {left:.0f} GB for the KV cache, less than {MIN_KV_FRACTION:.0%} of "
            f"{total / GB:.0f} GB: use more GPUs per replica or a smaller precision",
        ))
        return out
    per_token = kv_bytes_per_token(arch.layers, arch.kv_heads, arch.head_dim)
    if v.capacity.tokens_in_flight * per_token > kv:
        out.append((
            "error",
            "capacity.tokens_in_flight",
            f"{v.capacity.tokens_in_flight} tokens in flight need "
            f"{v.capacity.tokens_in_flight * per_token / GB:.1f} GB of KV cache; {where} has {kv / GB:.1f} GB",
        ))
    if v.gpus_per_replica > 1 and arch.attention_heads % v.gpus_per_replica:
        out.append((
            "error",
            "gpus_per_replica",
            f"tensor parallelism {v.gpus_per_replica} does not divide {arch.attention_heads} attention heads",
        ))
    tp, kvh = v.gpus_per_replica, arch.kv_heads
    if tp > 1 and kvh % tp and tp % kvh:
        out.append(("error", "gpus_per_replica", f"tensor parallelism {tp} and {kvh} KV heads: neither divides the other"))
    if v.precision == "4bit":
        out.append((
            "warning",
            "precision",
            "4-bit weights can hurt reasoning, maths and long outputs: reasoning quality needs an eval "
            "on the team's own set before this version ships",
        ))
    return out


def _memory(cfg: PlatformConfig, where: Origins) -> Iterable[Problem]:
    for i, v in enumerate(cfg.versions):
        at = where.of("versions", i).at
        for severity, field, message in memory_findings(v):
            yield Problem(at(*field.split(".")), message, "warning" if severity == "warning" else "error")
        model = cfg.model(v.model)
        if model and model.max_output_tokens >= v.engine_config.max_model_len:
            yield Problem(
                at("engine_config", "max_model_len"),
                f"max_model_len {v.engine_config.max_model_len} leaves no room for a prompt next to "
                f"the model's max_output_tokens {model.max_output_tokens}",
            )


def _local(cfg: PlatformConfig, where: Origins) -> Iterable[Problem]:
    teams = {t.name: t for t in cfg.teams}
    for team, key in cfg.local.dev_keys.items():
        at = where.of("local", 0).at("dev_keys", team)
        if team not in teams:
            yield Problem(at, f"team {team!r} is not declared")
        elif hash_key(key) not in teams[team].key_hashes:
            yield Problem(at, f"the hash of this key is not among team {team}'s key_hashes")
    keys = {v.key for v in cfg.versions}
    for key, n in cfg.local.replicas.items():
        if key not in keys:
            yield Problem(where.of("local", 0).at("replicas", key), f"{key} is not a declared version")
        if n < 0:
            yield Problem(where.of("local", 0).at("replicas", key), "replica count must be >= 0")


def _autoscaling(cfg: PlatformConfig, where: Origins) -> Iterable[Problem]:
    """Each known peak names declared models, versions and regions, and reaches some pool."""
    for i, peak in enumerate(cfg.autoscaling.peaks):
        at = where.of("autoscaling", 0).at
        if peak.model is not None and cfg.model(peak.model) is None:
            yield Problem(at("peaks", i, "model"), f"model {peak.model!r} is not declared")
        elif peak.model is not None and peak.version is not None \
                and cfg.version(peak.model, peak.version) is None:
            yield Problem(at("peaks", i, "version"), f"{peak.model}@{peak.version} is not a declared version")
        elif peak.region is not None and cfg.regions and peak.region not in cfg.regions:
            yield Problem(at("peaks", i, "region"), f"region {peak.region!r} is not in regions {list(cfg.regions)}")
        elif cfg.pools and not any(peak.applies_to(p.model, p.version, p.region) for p in cfg.pools):
            yield Problem(at("peaks", i), f"peak {peak.name!r} applies to no pool", "warning")


CHECKS: tuple[Check, ...] = (_duplicates, _aliases, _pools, _teams, _memory, _local, _autoscaling)


def cross_check(cfg: PlatformConfig, where: Origins) -> list[Problem]:
    """Every cross-record finding of ``cfg``, errors and warnings."""
    return [p for check in CHECKS for p in check(cfg, where)]
