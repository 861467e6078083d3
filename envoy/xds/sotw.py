"""The state-of-the-world ADS protocol for one stream, without any transport (pure state machine).

Feed it the stream's requests (:meth:`SotwStream.on_request`) and the cache's new snapshots
(:meth:`SotwStream.on_snapshot`); it returns the responses to send, in order. The rules:

- a request whose ``response_nonce`` is not the last nonce sent for its type is stale: ignored;
- a request with the current nonce ACKs (no ``error_detail``) or NACKs (``error_detail`` set)
  the last response of its type; a NACK is recorded and logged, and the rejected version is not
  sent again: Envoy keeps serving what it last accepted until a newer snapshot comes;
- a type is sent when the stream subscribed to it and its version in the snapshot differs from
  the version last sent on this stream (unchanged types are never resent), or when it names
  resources the stream has not been sent yet;
- a new snapshot is pushed type by type in the order CDS, EDS, LDS, RDS, and EDS is sent again
  after every CDS response even at an unchanged version: Envoy re-warms each added or changed
  cluster and waits for its ClusterLoadAssignment before using it.

EDS and RDS responses carry every resource of the type in the snapshot, not only the names last
requested: right after a CDS push the stream's EDS request still lists the old clusters, and the
new ones must get their assignments in the same EDS push. Envoy ignores resources it did not ask for.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass

from envoy_control.xds.snapshot import (
    CLUSTER,
    ENDPOINT,
    LISTENER,
    MESSAGE_TYPES,
    PUSH_ORDER,
    SHORT_NAMES,
    Snapshot,
)
from envoy_control.xds.status import XdsStatus

from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2

log = logging.getLogger(__name__)

WILDCARD_TYPES = frozenset({CLUSTER, LISTENER})
"""Types Envoy subscribes to as a whole (empty resource names mean "all")."""


@dataclass
class _TypeState:
    subscribed: bool = False
    names: frozenset[str] = frozenset()
    nonce: str = ""
    sent_version: str | None = None
    sent_names: frozenset[str] = frozenset()


class SotwStream:
    """One ADS stream's protocol state. ``stream_id`` makes nonces unique across streams."""

    def __init__(
        self, status: XdsStatus, stream_id: int, control_plane_id: str = "modelfleet"
    ) -> None:
        self.status = status
        self.stream_id = stream_id
        self.node_id: str | None = None
        self._control_plane = base_pb2.ControlPlane(identifier=control_plane_id)
        self._types: dict[str, _TypeState] = {}
        self._nonces = itertools.count(1)
        self._eds_after_cds = False

    def on_request(
        self, request: discovery_pb2.DiscoveryRequest, snapshot: Snapshot | None
    ) -> list[discovery_pb2.DiscoveryResponse]:
        """Handle one request from Envoy; returns the responses it calls for."""
        if self.node_id is None:
            self.node_id = str(request.node.id) or f"unknown-node-{self.stream_id}"
            self.status.connected(self.node_id, str(request.node.cluster))
        type_url = str(request.type_url)
        if type_url not in MESSAGE_TYPES:
            log.warning("node %s asked for unsupported type %s", self.node_id, type_url)
            return []
        st = self._types.setdefault(type_url, _TypeState())
        if request.response_nonce:
            if request.response_nonce != st.nonce:
                log.debug(
                    "stale %s request (nonce %s, current %s)",
                    SHORT_NAMES[type_url],
                    request.response_nonce,
                    st.nonce,
                )
                return []
            if request.HasField("error_detail"):
                self.status.nacked(
                    self.node_id,
                    type_url,
                    st.sent_version or "",
                    st.nonce,
                    str(request.error_detail.message),
                )
            else:
                self.status.acked(self.node_id, type_url, str(request.version_info))
        st.names = frozenset(request.resource_names)
        st.subscribed = type_url in WILDCARD_TYPES or bool(st.names)
        if snapshot is None:
            return []
        wanted = (type_url, ENDPOINT) if type_url == CLUSTER else (type_url,)
        return self._push(snapshot, wanted)

    def on_snapshot(self, snapshot: Snapshot) -> list[discovery_pb2.DiscoveryResponse]:
        """A new snapshot was published: the responses for every type that changed, in order."""
        return self._push(snapshot, PUSH_ORDER)

    def close(self) -> None:
        """The stream ended."""
        if self.node_id is not None:
            self.status.disconnected(self.node_id)

    def _due(self, type_url: str, snapshot: Snapshot) -> bool:
        st = self._types.get(type_url)
        if st is None or not st.subscribed:
            return False
        if st.sent_version != snapshot.type_version(type_url):
            return True
        if type_url == ENDPOINT and self._eds_after_cds:
            return True
        return bool((st.names - st.sent_names) & snapshot.names(type_url))

    def _push(
        self, snapshot: Snapshot, types: tuple[str, ...]
    ) -> list[discovery_pb2.DiscoveryResponse]:
        out = []
        for type_url in PUSH_ORDER:
            if type_url in types and self._due(type_url, snapshot):
                out.append(self._respond(type_url, snapshot))
        return out

    def _respond(self, type_url: str, snapshot: Snapshot) -> discovery_pb2.DiscoveryResponse:
        st = self._types[type_url]
        nonce = f"{self.stream_id}-{next(self._nonces)}"
        version = snapshot.type_version(type_url)
        resources = snapshot.resources.get(type_url, ())
        response = discovery_pb2.DiscoveryResponse(
            version_info=version,
            type_url=type_url,
            nonce=nonce,
            resources=[r.packed for r in resources],
            control_plane=self._control_plane,
        )
        st.nonce, st.sent_version, st.sent_names = nonce, version, snapshot.names(type_url)
        if type_url == CLUSTER:
            self._eds_after_cds = True
        elif type_url == ENDPOINT:
            self._eds_after_cds = False
        assert self.node_id is not None
        self.status.sent(self.node_id, type_url, version, nonce)
        log.debug(
            "sent %s version %s (%d resources, nonce %s) to %s",
            SHORT_NAMES[type_url],
            version,
            len(resources),
            nonce,
            self.node_id,
        )
        return response
