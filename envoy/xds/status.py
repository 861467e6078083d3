"""What each connected Envoy was sent, ACKed and NACKed, per node and type URL.

The server records here; the HTTP API (``GET /v1/xds/status``), the tests and the convergence
benchmark read it. Times are Unix seconds from an injected clock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from envoy_control.xds.snapshot import PUSH_ORDER, SHORT_NAMES

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Nack:
    """Envoy rejected ``version`` of a type: ``message`` is Envoy's error text; ``at`` Unix seconds."""

    version: str
    nonce: str
    message: str
    at: float


@dataclass
class TypeStatus:
    """One type URL on one node: the last version sent and the last version ACKed."""

    sent_version: str = ""
    sent_nonce: str = ""
    sent_at: float | None = None
    acked_version: str = ""
    acked_at: float | None = None
    nack_count: int = 0
    last_nack: Nack | None = None


@dataclass
class NodeStatus:
    """One Envoy node (by node id): its streams and per-type status."""

    node_id: str
    cluster: str = ""
    streams: int = 0
    connected_at: float | None = None
    types: dict[str, TypeStatus] = field(default_factory=dict)

    def of(self, type_url: str) -> TypeStatus:
        """The status of ``type_url`` on this node (created empty on first use)."""
        return self.types.setdefault(type_url, TypeStatus())


Listener = Callable[[], None]


class XdsStatus:
    """The per-node, per-type record of the ADS conversation. ``clock`` returns Unix seconds."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._nodes: dict[str, NodeStatus] = {}
        self._listeners: list[Listener] = []

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` after every change; returns the function that unsubscribes."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def _changed(self) -> None:
        for listener in list(self._listeners):
            listener()

    def node(self, node_id: str) -> NodeStatus | None:
        """The status of ``node_id``, if it ever connected."""
        return self._nodes.get(node_id)

    def nodes(self) -> list[NodeStatus]:
        """Every node that ever connected, by node id."""
        return [self._nodes[k] for k in sorted(self._nodes)]

    def connected(self, node_id: str, cluster: str) -> None:
        """A stream from ``node_id`` opened."""
        node = self._nodes.setdefault(node_id, NodeStatus(node_id))
        node.cluster = cluster
        node.streams += 1
        node.connected_at = self._clock()
        self._changed()

    def disconnected(self, node_id: str) -> None:
        """A stream from ``node_id`` closed."""
        node = self._nodes.get(node_id)
        if node is not None:
            node.streams = max(0, node.streams - 1)
            self._changed()

    def sent(self, node_id: str, type_url: str, version: str, nonce: str) -> None:
        """A response of ``type_url`` at ``version`` went to ``node_id``."""
        st = self._nodes.setdefault(node_id, NodeStatus(node_id)).of(type_url)
        st.sent_version, st.sent_nonce, st.sent_at = version, nonce, self._clock()
        self._changed()

    def acked(self, node_id: str, type_url: str, version: str) -> None:
        """``node_id`` applied ``version`` of ``type_url``."""
        st = self._nodes.setdefault(node_id, NodeStatus(node_id)).of(type_url)
        st.acked_version, st.acked_at = version, self._clock()
        self._changed()

    def nacked(self, node_id: str, type_url: str, version: str, nonce: str, message: str) -> None:
        """``node_id`` rejected ``version`` of ``type_url`` with Envoy's error ``message``."""
        st = self._nodes.setdefault(node_id, NodeStatus(node_id)).of(type_url)
        st.nack_count += 1
        st.last_nack = Nack(version, nonce, message, self._clock())
        log.warning(
            "xDS NACK from node %s for %s version %s (nonce %s); still serving version %r: %s",
            node_id,
            SHORT_NAMES.get(type_url, type_url),
            version,
            nonce,
            st.acked_version,
            message,
        )
        self._changed()

    def all_acked(self, versions: Mapping[str, str], node_ids: Iterable[str] | None = None) -> bool:
        """Whether every node (or each of ``node_ids``) has ACKed each ``type URL -> version``.

        Only connected nodes count when ``node_ids`` is None.
        """
        if node_ids is None:
            nodes = [n for n in self._nodes.values() if n.streams > 0]
        else:
            nodes = [self._nodes[i] for i in node_ids if i in self._nodes]
            if len(nodes) != len(set(node_ids)):
                return False
        return all(n.of(t).acked_version == v for n in nodes for t, v in versions.items() if v)

    def as_dict(self) -> dict[str, Any]:
        """Plain data for ``GET /v1/xds/status``: per node and type (``cds``, ``eds``, ...)."""
        out: dict[str, Any] = {}
        for node in self.nodes():
            types = {
                SHORT_NAMES.get(t, t): asdict(node.types[t])
                for t in sorted(
                    node.types, key=lambda t: PUSH_ORDER.index(t) if t in PUSH_ORDER else 99
                )
            }
            out[node.node_id] = {
                "cluster": node.cluster,
                "connected": node.streams > 0,
                "streams": node.streams,
                "connected_at": node.connected_at,
                "types": types,
            }
        return out
