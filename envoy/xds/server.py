"""The ADS gRPC server (grpc.aio): carries :class:`SotwStream` over each Envoy's stream.

Each stream reads Envoy's requests in a task of its own and merges them with the cache's
snapshot notices into one inbox, so requests and pushes are handled one at a time, in order.
Only the state-of-the-world variant is served; the delta variant answers UNIMPLEMENTED.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator
from typing import TypeAlias

import grpc
from envoy_control.xds.cache import SnapshotCache
from envoy_control.xds.snapshot import Snapshot
from envoy_control.xds.sotw import SotwStream

from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2

log = logging.getLogger(__name__)

Request: TypeAlias = discovery_pb2.DiscoveryRequest
Response: TypeAlias = discovery_pb2.DiscoveryResponse
_END = object()


class AdsServer:
    """The AggregatedDiscoveryService servicer over one :class:`SnapshotCache`."""

    def __init__(self, cache: SnapshotCache, control_plane_id: str = "modelfleet") -> None:
        self.cache = cache
        self.control_plane_id = control_plane_id
        self._stream_ids = itertools.count(1)

    async def StreamAggregatedResources(
        self,
        request_iterator: AsyncIterator[Request],
        context: grpc.aio.ServicerContext[Request, Response],
    ) -> AsyncIterator[Response]:
        """One Envoy's state-of-the-world ADS stream, until either side closes it."""
        inbox: asyncio.Queue[object] = asyncio.Queue()
        stream = SotwStream(self.cache.status, next(self._stream_ids), self.control_plane_id)

        async def read() -> None:
            try:
                async for request in request_iterator:
                    inbox.put_nowait(request)
            except (asyncio.CancelledError, grpc.RpcError, grpc.aio.AioRpcError):
                pass
            except Exception:
                log.exception("ADS stream %d: reading failed", stream.stream_id)
            finally:
                inbox.put_nowait(_END)

        reader = asyncio.create_task(read())
        unwatch = self.cache.watch(inbox.put_nowait)
        try:
            while True:
                item = await inbox.get()
                if item is _END:
                    break
                if isinstance(item, Snapshot):
                    latest = self.cache.snapshot
                    responses = stream.on_snapshot(latest if latest is not None else item)
                else:
                    responses = stream.on_request(item, self.cache.snapshot)
                for response in responses:
                    yield response
        finally:
            unwatch()
            reader.cancel()
            stream.close()
            log.info("ADS stream %d from node %s closed", stream.stream_id, stream.node_id)

    async def DeltaAggregatedResources(
        self,
        request_iterator: AsyncIterator[discovery_pb2.DeltaDiscoveryRequest],
        context: grpc.aio.ServicerContext[
            discovery_pb2.DeltaDiscoveryRequest, discovery_pb2.DeltaDiscoveryResponse
        ],
    ) -> None:
        """Not served: configure Envoy with ``api_type: GRPC`` (state of the world)."""
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED, "modelfleet serves state-of-the-world ADS only"
        )


async def start_ads_server(
    cache: SnapshotCache, host: str, port: int, control_plane_id: str = "modelfleet"
) -> tuple[grpc.aio.Server, int]:
    """Start serving ADS on ``host:port`` (TCP port; 0 picks a free one).

    Returns the started server and its port; stop it with ``await server.stop(grace_s)``.
    """
    server = grpc.aio.server(
        options=[
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ]
    )
    ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(
        AdsServer(cache, control_plane_id), server
    )
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind the xDS port {host}:{port}")
    await server.start()
    log.info("ADS (state of the world) serving on %s:%d", host, bound)
    return server, bound
