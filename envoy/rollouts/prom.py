"""Guard metrics of one version read from Prometheus (PromQL over the replicas' vLLM metrics).

Every replica's series carry ``model`` and ``version`` labels: in a cluster the PodMonitor
copies them from the pod labels (``autoscale.naming.pod_monitor``), outside one
``autoscale.promconfig.prometheus_config`` sets them per target. A version's series are
selected by ``{model="chat-7b",version="v14"}`` (``model_name`` cannot tell a canary from the
live version: both serve the same name). Over a window ``W``:

| guard metric | PromQL (``$SEL`` = the version's labels, ``$W`` = the window) |
|---|---|
| finished requests | ``sum(increase(vllm:e2e_request_latency_seconds_count{$SEL}[$W]))`` |
| error rate | requests that finished other than ``stop``/``length`` (``abort``) over all finished, from vLLM's ``vllm:request_success_total{finished_reason}`` (the simulated replica exports it too) |
| p95 TTFT, s | ``histogram_quantile(0.95, sum by (le) (increase(vllm:time_to_first_token_seconds_bucket{$SEL}[$W])))`` |
| output tokens per request | ``increase(vllm:generation_tokens_total)`` over finished requests |
| refusal rate | ``modelfleet_refusals_total`` (the replica middleware's count of answers opening with a refusal, :mod:`replica_middleware.refusals`) over finished requests |

A query with no answer (series not exported, nothing in the window) reads as None: that metric
is not judged (:mod:`envoy_control.rollouts.guard`). Metric and label names come from
:mod:`modelfleet.contract.metrics`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import httpx
from envoy_control.rollouts.guard import VersionMetrics

from modelfleet.contract.metrics import (
    BUCKET_LABEL,
    FINISHED_LENGTH,
    FINISHED_REASON_LABEL,
    FINISHED_STOP,
    MODEL_LABEL,
    REFUSALS,
    VERSION_LABEL,
    VLLM_E2E,
    VLLM_GENERATION_TOKENS,
    VLLM_REQUEST_SUCCESS,
    VLLM_TTFT,
)

REQUESTS = f"sum(increase({VLLM_E2E}_count{{$SEL}}[$W]))"
ERROR_RATE = (
    f'sum(increase({VLLM_REQUEST_SUCCESS}'
    f'{{$SEL,{FINISHED_REASON_LABEL}!~"{FINISHED_STOP}|{FINISHED_LENGTH}"}}[$W]))'
    f" / sum(increase({VLLM_REQUEST_SUCCESS}{{$SEL}}[$W]))"
)
TTFT_P95 = (
    f"histogram_quantile(0.95, sum by ({BUCKET_LABEL}) "
    f"(increase({VLLM_TTFT}_bucket{{$SEL}}[$W])))"
)
OUTPUT_TOKENS_MEAN = f"sum(increase({VLLM_GENERATION_TOKENS}{{$SEL}}[$W])) / {REQUESTS}"
REFUSAL_RATE = f"sum(increase({REFUSALS}{{$SEL}}[$W])) / {REQUESTS}"


@dataclass(frozen=True)
class GuardQueries:
    """The PromQL templates of the guard metrics (``$SEL``, ``$W`` substituted per read)."""

    requests: str = REQUESTS
    error_rate: str = ERROR_RATE
    ttft_p95_s: str = TTFT_P95
    output_tokens_mean: str = OUTPUT_TOKENS_MEAN
    refusal_rate: str = REFUSAL_RATE


def duration(seconds: float) -> str:
    """A PromQL range: whole seconds as ``30s``, otherwise milliseconds (``1500ms``)."""
    if seconds <= 0:
        raise ValueError("a window must be positive")
    return f"{int(seconds)}s" if float(seconds).is_integer() else f"{round(seconds * 1000)}ms"


def selector(model: str, version: str, extra: dict[str, str] | None = None) -> str:
    """The label matchers of one version's series: ``model="chat-7b",version="v14"``."""
    labels = {**(extra or {}), MODEL_LABEL: model, VERSION_LABEL: version}
    quoted = (v.replace("\\", "\\\\").replace('"', '\\"') for v in labels.values())
    return ",".join(f'{k}="{v}"' for k, v in zip(labels, quoted, strict=True))


def render(template: str, sel: str, window_s: float) -> str:
    """``template`` with ``$SEL`` and ``$W`` filled in."""
    return template.replace("$SEL", sel).replace("$W", duration(window_s))


def queries_for(model: str, version: str, window_s: float, queries: GuardQueries = GuardQueries(),
                extra: dict[str, str] | None = None) -> dict[str, str]:
    """Guard metric name -> PromQL for ``model@version`` over ``window_s`` seconds."""
    sel = selector(model, version, extra)
    return {name: render(getattr(queries, name), sel, window_s)
            for name in ("requests", "error_rate", "ttft_p95_s", "output_tokens_mean",
                         "refusal_rate")}


def scalar(answer: dict[str, Any]) -> float | None:
    """The single value of an instant-query answer; None when empty or NaN. Raises ValueError
    on an error answer or more than one series."""
    if answer.get("status") != "success":
        raise ValueError(f"Prometheus: {answer.get('errorType')}: {answer.get('error')}")
    result = answer["data"]["result"]
    if not result:
        return None
    if len(result) > 1:
        raise ValueError(f"expected one series, got {len(result)}")
    value = float(result[0]["value"][1])
    return None if math.isnan(value) or math.isinf(value) else value


class PromGuardReader:
    """Reads :class:`VersionMetrics` from the Prometheus at ``url`` through ``client``."""

    def __init__(self, client: httpx.AsyncClient, url: str, queries: GuardQueries = GuardQueries(),
                 extra_labels: dict[str, str] | None = None, timeout_s: float = 5.0) -> None:
        self.client, self.url = client, url.rstrip("/")
        self.queries, self.extra, self.timeout_s = queries, extra_labels, timeout_s

    async def query(self, promql: str) -> float | None:
        """One instant query's value (see :func:`scalar`); raises httpx/ValueError errors."""
        r = await self.client.get(f"{self.url}/api/v1/query", params={"query": promql},
                                  timeout=self.timeout_s)
        return scalar(r.json())

    async def read(self, model: str, version: str, window_s: float) -> VersionMetrics:
        """The guard metrics of ``model@version`` over the last ``window_s`` seconds."""
        values = {name: await self.query(q)
                  for name, q in queries_for(model, version, window_s, self.queries,
                                             self.extra).items()}
        requests = values.pop("requests")
        return VersionMetrics(requests=requests or 0.0, **values)
