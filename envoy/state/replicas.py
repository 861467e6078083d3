"""The replica set as plain data: which replica serves which ``model@version`` at which address."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

REPLICA_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$"
"""A replica id (e.g. ``chat-7b@v13-0``): it becomes an Envoy endpoint hostname, a ring-hash key
and a response header value, so no spaces, slashes or other punctuation."""


@dataclass(frozen=True)
class Replica:
    """One model server (a vLLM process or a simulated one) serving ``model@version``.

    ``host`` is an IP address and ``port`` a TCP port on it.
    """

    replica_id: str
    model: str
    version: str
    host: str
    port: int

    @property
    def key(self) -> str:
        """``model@version``: the name of the Envoy cluster this replica belongs to."""
        return f"{self.model}@{self.version}"

    def __post_init__(self) -> None:
        if not re.match(REPLICA_ID_PATTERN, self.replica_id):
            raise ValueError(f"replica id {self.replica_id!r} must match {REPLICA_ID_PATTERN}")
        if not 0 < self.port < 65536:
            raise ValueError(f"port {self.port} is not a TCP port (1..65535)")
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            raise ValueError(
                f"host {self.host!r} must be an IP address (EDS endpoints are not resolved)"
            ) from None


def replicas_by_key(replicas: Iterable[Replica]) -> dict[str, tuple[Replica, ...]]:
    """Replicas grouped by ``model@version``, each group sorted by replica id (deterministic)."""
    groups: dict[str, list[Replica]] = {}
    for r in replicas:
        groups.setdefault(r.key, []).append(r)
    return {k: tuple(sorted(v, key=lambda r: r.replica_id)) for k, v in groups.items()}
