"""Scale-down that breaks no stream: the drain timings of a replica leaving its pool.

When the HPA removes a replica, Kubernetes deletes its pod and, at once, marks it terminating in
the EndpointSlice. Then, in order:

1. ``preStop`` (``prestop_s``): the pod keeps serving while the removal travels through the
   control plane (EndpointSlice watch -> snapshot -> ADS push to every Envoy, and the router
   state to every gateway_ext pod); requests picked just before still arrive and are served;
2. SIGTERM: vLLM, started with ``--shutdown-timeout <shutdown_timeout_s>``, refuses new requests
   and lets the in-flight streams finish, up to that many seconds;
3. the process exits; ``terminationGracePeriodSeconds`` (``grace_s``) covers 1 and 2 plus an
   exit margin, so the kubelet's SIGKILL never cuts a stream that was inside its bound.

The bound on one stream is the longest answer a request may ask for (``max_output_tokens``,
or ``max_model_len`` if smaller) at the slowest rate the version was load-tested to keep
(``capacity.output_tokens_per_s / capacity.streams``: every stream's share at capacity; a
draining replica takes no new work, so its streams only get faster), plus the TTFT budget for a
request still waiting, capped at ``stream_cap_s`` so no drain outlasts one scale-down period.
All values are seconds, rounded up to whole seconds as Kubernetes and vLLM take them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from modelfleet.config.autoscaling import DrainPolicy
from modelfleet.config.schema import Model, Version

__all__ = ["DrainPolicy", "DrainValues", "drain_values", "prestop_s", "slowest_stream_rate",
           "stream_bound_s"]


@dataclass(frozen=True)
class DrainValues:
    """The drain timings of one version's replicas, whole seconds (rate in tokens per second)."""

    slowest_stream_tokens_per_s: float
    max_output_tokens: int
    stream_bound_s: int
    prestop_s: int
    shutdown_timeout_s: int
    grace_s: int

    def pod_spec_fields(self) -> dict[str, Any]:
        """Fields the IaC sets on the pod spec."""
        return {"terminationGracePeriodSeconds": self.grace_s}

    def container_fields(self) -> dict[str, Any]:
        """Fields the IaC sets on the vLLM container: the preStop sleep (Kubernetes >= 1.30
        ``sleep`` action; an ``exec`` of ``sleep`` does the same on older clusters)."""
        return {"lifecycle": {"preStop": {"sleep": {"seconds": self.prestop_s}}}}

    def engine_args(self) -> list[str]:
        """Arguments added to ``vllm serve``."""
        return ["--shutdown-timeout", str(self.shutdown_timeout_s)]


def slowest_stream_rate(version: Version) -> float:
    """Tokens per second one stream keeps at the version's load-tested capacity."""
    return version.capacity.output_tokens_per_s / version.capacity.streams


def stream_bound_s(model: Model, version: Version, policy: DrainPolicy | None = None) -> float:
    """The longest a stream may take on this version, seconds (before rounding)."""
    policy = policy or DrainPolicy()
    longest = min(model.max_output_tokens, version.engine_config.max_model_len)
    return min(policy.stream_cap_s, policy.ttft_budget_s + longest / slowest_stream_rate(version))


def prestop_s(policy: DrainPolicy | None = None) -> int:
    """The preStop sleep, seconds: endpoint removal propagated everywhere, with margin."""
    policy = policy or DrainPolicy()
    steps = (policy.endpoint_update_s + policy.snapshot_s + policy.xds_push_s
             + policy.router_refresh_s + policy.in_flight_pick_s)
    return math.ceil(steps * policy.safety_factor)


def drain_values(model: Model, version: Version, policy: DrainPolicy | None = None) -> DrainValues:
    """Stream bound, preStop, vLLM ``--shutdown-timeout`` and termination grace for ``version``
    of ``model``, seconds; grace >= preStop + shutdown timeout + exit margin."""
    if model.name != version.model:
        raise ValueError(f"version {version.key} is not a version of model {model.name}")
    policy = policy or DrainPolicy()
    bound = math.ceil(stream_bound_s(model, version, policy))
    pre = prestop_s(policy)
    return DrainValues(
        slowest_stream_tokens_per_s=slowest_stream_rate(version),
        max_output_tokens=min(model.max_output_tokens, version.engine_config.max_model_len),
        stream_bound_s=bound,
        prestop_s=pre,
        shutdown_timeout_s=bound,
        grace_s=pre + bound + math.ceil(policy.exit_margin_s),
    )
