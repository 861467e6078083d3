"""What the local stack runs, decided from the config alone (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from modelfleet.config import PlatformConfig


@dataclass(frozen=True)
class ReplicaPlan:
    """One simulated replica to start."""

    replica_id: str
    model: str
    version: str
    index: int

    @property
    def target(self) -> str:
        """``model@version``."""
        return f"{self.model}@{self.version}"


def replica_counts(cfg: PlatformConfig) -> dict[str, int]:
    """Replicas per ``model@version`` for the local stack.

    ``local.replicas`` wins where it names a version; every other version that is live, in
    canary or in shadow gets one replica so each route has somewhere to go.
    """
    counts: dict[str, int] = {}
    for m in cfg.models:
        routed = [m.live]
        if m.canary is not None:
            routed.append(m.canary.version)
        if m.shadow is not None:
            routed.append(m.shadow.version)
        for v in routed:
            counts.setdefault(f"{m.name}@{v}", 1)
    counts.update(cfg.local.replicas)
    return {k: n for k, n in counts.items() if n > 0}


def replica_plan(cfg: PlatformConfig) -> list[ReplicaPlan]:
    """Every replica to start, with stable ids ``model@version-N``."""
    out = []
    for target, n in sorted(replica_counts(cfg).items()):
        model, version = target.split("@", 1)
        out += [ReplicaPlan(f"{target}-{i}", model, version, i) for i in range(n)]
    return out
