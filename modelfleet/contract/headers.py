"""The wire contract between Envoy, gateway_ext and the replicas: header names, paths, codes.

Envoy's ``ext_authz`` filter (``envoy_control.resources.ext_authz``) sends gateway_ext a *check request*:
the client's method, ``AUTHZ_PATH_PREFIX`` + the client's path, the body (at most
``MAX_BODY_BYTES``) and only the headers in ``CHECK_HEADERS``.

gateway_ext answers:

* **200**: allowed. ``UPSTREAM_HEADERS`` are set on the upstream request (overwriting anything the
  client sent; Envoy also strips every client ``x-route-version`` / ``x-modelfleet-*`` header
  before the check), and the route is chosen again on ``x-route-version``. Headers with the
  ``RATELIMIT_PREFIX`` go to the client's response.
* **4xx**: refused. Status, OpenAI-shaped JSON body and ``CLIENT_HEADERS`` / ``x-ratelimit-*``
  reach the client as they are.
* **SHED_STATUS** (a 4xx code no one else uses): a 503 refusal. Envoy treats any 5xx from an HTTP
  authorization service as a failure of the service (``status_on_error``) and drops its body and
  headers, so the gateway answers 503s with this code and Envoy's local-reply mapper turns it
  back into a 503, keeping the JSON body and ``Retry-After``.

The replica settles a reservation by POSTing its real usage to ``SETTLE_PATH`` on gateway_ext
(see :mod:`gateway_ext.settle`).
"""

from __future__ import annotations

AUTHZ_PATH_PREFIX = "/authz"
"""Envoy's ``path_prefix`` for check requests: ``POST /v1/chat/completions`` is checked at
``POST /authz/v1/chat/completions``."""
SETTLE_PATH = "/v1/settle"
"""Where replicas report the real usage of a reservation."""
CHAT_PATH = "/v1/chat/completions"
METRICS_PATH = "/metrics"
"""A replica's (and every service's) Prometheus exposition."""

PRIORITY_HEADER = "x-priority"
"""The client's tier: ``interactive``, ``standard`` or ``batch``."""
CONVERSATION_HEADER = "x-conversation-id"
"""The client's conversation id: the routing key (pins, the canary split, the replica ring)."""
REQUEST_ID_HEADER = "x-request-id"
"""Envoy's request id, which a replica uses in the completion id and the batch worker records."""
UPSTREAM_HOST_HEADER = "x-modelfleet-upstream"
"""Response header Envoy adds: the replica's address (``ip:port``)."""
UPSTREAM_CLUSTER_HEADER = "x-modelfleet-cluster"
"""Response header Envoy adds: the cluster that served the request (``model@version``)."""
UPSTREAM_REPLICA_HEADER = "x-modelfleet-replica"
"""Response header Envoy adds: the replica's id."""

ROUTE_VERSION_HEADER = "x-route-version"
"""``model@version`` the request goes to; Envoy's routes match it exactly."""
TEAM_HEADER = "x-modelfleet-team"
TIER_HEADER = "x-modelfleet-tier"
RESERVATION_HEADER = "x-modelfleet-reservation"
"""The reservation id the replica settles."""
DESTINATION_HEADER = "x-gateway-destination-endpoint"
"""The picked replica and its fallbacks, ``ip:port,ip:port,...``: Envoy's ``override_host``
load-balancing policy sends the first attempt to the first address, each retry to the next one
(addresses not in the cluster are skipped); absent, the cluster's ring hash picks. Envoy removes
a client's copy before the check."""
SHADOW_HEADER = "x-modelfleet-shadow"
"""Set by Envoy (``1``) on the copies it mirrors to a shadow version (which also lose the
reservation and destination headers): the replica records them apart and never settles them."""
UPSTREAM_HEADERS = (ROUTE_VERSION_HEADER, TEAM_HEADER, TIER_HEADER, RESERVATION_HEADER,
                    DESTINATION_HEADER)
"""Set by the gateway on an allowed request, for the router and the replica."""
GATEWAY_HEADER_PREFIX = "x-modelfleet-"
"""Client request headers with this prefix (and ``x-route-version``) are removed by Envoy before
the check: only the gateway may set them."""

CHECK_HEADERS = ("authorization", PRIORITY_HEADER, CONVERSATION_HEADER, "content-type",
                 "content-length")
"""Client headers Envoy passes to the check (with method, path and host)."""
RATELIMIT_PREFIX = "x-ratelimit-"
CLIENT_HEADERS = ("retry-after", "retry-after-ms", "content-type")
"""Headers of a refusal that reach the client (besides ``x-ratelimit-*``)."""

SHED_STATUS = 460
"""The status gateway_ext answers a 503 refusal with; Envoy maps it back to 503 (see above)."""
MAX_BODY_BYTES = 1 << 20
"""Largest request body, in bytes (1 MiB): Envoy answers 413 above it without calling the gateway."""
