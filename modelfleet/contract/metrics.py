"""Metric and label names the platform writes and reads, and the buckets of its histograms.

Every exporter (the replica middleware, the simulated engine, gateway_ext, the batch service) and
every reader (the rollout guard's PromQL, the autoscaler's triggers, the heartbeat, the local
autoscaler, the tests) takes its names from here, so a name has one spelling. The Prometheus
rules under ``rules/`` cannot import Python: ``tests/modelfleet/test_contract_metrics.py`` checks
that every metric and label their expressions use is declared here.

**Spelling.** A counter is spelled as PromQL and the text exposition read it, with ``_total``
(``prometheus_client``'s ``Counter`` and ``CounterMetricFamily`` take that spelling and export
the same); a histogram by its family name, read in PromQL with ``_bucket``, ``_count`` and
``_sum`` (:func:`declared` accepts those). Gauges are spelled as they are.

**Who exports what.**

- ``vllm:*``: vLLM itself in production, the simulated engine (``replica.metrics``) locally,
  with vLLM's labels ``model_name`` and ``engine``;
- ``modelfleet_replica_*`` (tokens in flight among them) and ``modelfleet_refusals_total``: the
  replica middleware (``replica_middleware.metrics``), which runs inside real vLLM and the
  simulated engine alike, so a pool's replicas export them whatever the engine; the engine
  itself exports no ``modelfleet_*`` load figure (one series per quantity);
- ``modelfleet_replica_info``: the simulated engine only (its identity);
- ``modelfleet_gateway_*``: gateway_ext; ``modelfleet_batch_*``: the batch service.

**The ``pool`` label: one spelling, ``<model>@<version>``** (``chat-7b@v13``), the platform's
pool key everywhere else (Envoy's cluster, ``x-route-version``, gateway_ext's pools). gateway_ext
sets it on its per-pool series itself. A replica's series get it from the scrape: Kubernetes
label values cannot hold ``@``, so the pod label ``modelfleet.io/pool`` holds the DNS-safe pool
*name* (``chat-7b-v13``, ``autoscale.naming.pool_name``: object names and selectors only, never a
Prometheus label value), and the PodMonitor (``autoscale.naming.pod_monitor``) builds ``pool``
by joining the pod labels ``modelfleet.io/model`` and ``modelfleet.io/version`` with
:data:`POOL_SEPARATOR`; outside a cluster ``autoscale.promconfig`` sets the same value
statically. One matcher, ``{namespace="modelfleet",pool="chat-7b@v13"}``, therefore selects a
pool's replica and gateway series alike (:func:`pool_label_value`).
"""

from __future__ import annotations

# --------------------------------------------------------------------------- label names

MODEL_NAME_LABEL = "model_name"
"""vLLM's label: the first served model name (a canary and the live version share it, so no
query selects a pool by it)."""
ENGINE_LABEL = "engine"
"""vLLM's label: the engine index within the server (``"0"``)."""
FINISHED_REASON_LABEL = "finished_reason"
"""vLLM's label on :data:`VLLM_REQUEST_SUCCESS`: how a request left the engine."""
FINISHED_STOP = "stop"
""":data:`FINISHED_REASON_LABEL` value: an end token or stop string."""
FINISHED_LENGTH = "length"
""":data:`FINISHED_REASON_LABEL` value: ``max_tokens`` or the context reached."""
FINISHED_ABORT = "abort"
""":data:`FINISHED_REASON_LABEL` value: the client left, or the engine failed, first."""
FINISHED_REASONS = (FINISHED_STOP, FINISHED_LENGTH, FINISHED_ABORT)
"""vLLM's ``finished_reason`` values (``vllm.v1.engine.FinishReason``, lower-cased)."""

NAMESPACE_LABEL = "namespace"
"""The scrape's label: the pod's namespace (set by the Prometheus Operator, or statically)."""
POOL_LABEL = "pool"
"""A pool, spelled ``<model>@<version>`` (:func:`pool_label_value`; see the module's text)."""
MODEL_LABEL = "model"
"""The model: the served model on a replica's series (from the scrape, like ``version``), the
requested model on gateway_ext's and the batch service's team series."""
VERSION_LABEL = "version"
"""The scrape's label on a replica's series: the version it serves (``v13``)."""
REPLICA_LABEL = "replica"
"""The scrape's label on a replica's series outside a cluster (``autoscale.promconfig``)."""
BUCKET_LABEL = "le"
"""Prometheus' histogram bucket bound label."""

MODEL_VERSION_LABEL = "model_version"
"""The middleware's label (the version, ``v13``) and the simulated engine's info label
(``model@version``)."""
TRAFFIC_LABEL = "traffic"
"""The middleware's label: :data:`TRAFFIC_SERVED` or :data:`TRAFFIC_SHADOW`."""
TRAFFIC_SERVED = "served"
"""A request a client waits for."""
TRAFFIC_SHADOW = "shadow"
"""A copy Envoy mirrored to a shadow version; its answer is discarded."""
OUTCOME_LABEL = "outcome"
"""How something ended: a middleware request, a batch line, a conversation pin."""
REPLICA_ID_LABEL = "replica_id"
"""The simulated engine's info label: the replica's id."""
REGION_LABEL = "region"
"""The simulated engine's info label: the replica's region."""

TEAM_LABEL = "team"
TIER_LABEL = "tier"
"""``interactive``, ``standard`` or ``batch``."""
KIND_LABEL = "kind"
"""gateway_ext's token kind: ``prompt``, ``cached`` or ``output``."""
EVENT_LABEL = "event"
"""gateway_ext's bucket event: ``reserved``, ``refunded`` or ``overcharged``."""
REASON_LABEL = "reason"
"""Why: a 429's reason, a replica pick's reason."""
OP_LABEL = "op"
"""gateway_ext's bucket-store operation that fell back."""
STATUS_LABEL = "status"
"""The batch service's HTTP status (or ``unreachable``), or a batch's final status."""

LABELS = frozenset({
    MODEL_NAME_LABEL, ENGINE_LABEL, FINISHED_REASON_LABEL, NAMESPACE_LABEL, POOL_LABEL,
    MODEL_LABEL, VERSION_LABEL, REPLICA_LABEL, BUCKET_LABEL, MODEL_VERSION_LABEL, TRAFFIC_LABEL,
    OUTCOME_LABEL, REPLICA_ID_LABEL, REGION_LABEL, TEAM_LABEL, TIER_LABEL, KIND_LABEL,
    EVENT_LABEL, REASON_LABEL, OP_LABEL, STATUS_LABEL,
})
"""Every label name the platform's series carry or its queries use."""

POOL_SEPARATOR = "@"
"""Between model and version in a :data:`POOL_LABEL` value (and in a pool key)."""


def pool_label_value(model: str, version: str) -> str:
    """The :data:`POOL_LABEL` value of a pool: ``chat-7b@v13``."""
    return f"{model}{POOL_SEPARATOR}{version}"


# --------------------------------------------------------------------------- histogram buckets

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
"""Time-to-first-token histogram buckets, in seconds (vLLM's own for
``vllm:time_to_first_token_seconds``; the middleware's TTFT histogram uses the same)."""
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)
"""Inter-token latency histogram buckets, in seconds (vLLM's own)."""
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
"""End-to-end request latency histogram buckets, in seconds (vLLM's own)."""
OUTPUT_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
"""Completion-length histogram buckets, in tokens (the middleware's)."""
QUEUE_WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                      300.0)
"""Admission queue-wait histogram buckets, in seconds (gateway_ext's)."""

# --------------------------------------------------------------------------- vLLM's metrics

VLLM_RUNNING = "vllm:num_requests_running"
"""Gauge, requests: requests in the engine's running batch."""
VLLM_WAITING = "vllm:num_requests_waiting"
"""Gauge, requests: requests waiting for a place in the running batch (the queue trigger's
engine part)."""
VLLM_KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
"""Gauge, fraction 0..1 (despite the name): KV-cache blocks in use."""
VLLM_GPU_CACHE_USAGE = "vllm:gpu_cache_usage_perc"
"""Gauge, fraction 0..1: older vLLM's name for :data:`VLLM_KV_CACHE_USAGE` (read, never written)."""
VLLM_KV_CACHE_USAGE_NAMES = (VLLM_KV_CACHE_USAGE, VLLM_GPU_CACHE_USAGE)
"""Either spelling of KV-cache usage, newest first, as the heartbeat reads them."""
VLLM_PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries_total"
"""Counter, tokens: prompt tokens looked up in the prefix cache."""
VLLM_PREFIX_CACHE_HITS = "vllm:prefix_cache_hits_total"
"""Counter, tokens: prompt tokens found in the prefix cache."""
VLLM_PROMPT_TOKENS = "vllm:prompt_tokens_total"
"""Counter, tokens: prefill tokens processed."""
VLLM_GENERATION_TOKENS = "vllm:generation_tokens_total"
"""Counter, tokens: output tokens generated."""
VLLM_PREEMPTIONS = "vllm:num_preemptions_total"
"""Counter, preemptions: requests the engine preempted."""
VLLM_REQUEST_SUCCESS = "vllm:request_success_total"
"""Counter, requests: requests that left the engine, by :data:`FINISHED_REASON_LABEL`."""
VLLM_TTFT = "vllm:time_to_first_token_seconds"
"""Histogram, seconds (model seconds on the simulated engine): time to first token
(:data:`TTFT_BUCKETS`)."""
VLLM_ITL = "vllm:inter_token_latency_seconds"
"""Histogram, seconds: gap between two tokens of a stream (:data:`ITL_BUCKETS`)."""
VLLM_E2E = "vllm:e2e_request_latency_seconds"
"""Histogram, seconds: arrival to last token; its ``_count`` is the finished requests
(:data:`E2E_BUCKETS`)."""

# --------------------------------------------------------------------------- the replica middleware's

TOKENS_IN_FLIGHT = "modelfleet_replica_tokens_in_flight"
"""Gauge, tokens: prompt plus remaining output (``max_tokens`` minus what was streamed) of every
request a replica holds, running or waiting, as its middleware counts them; the same figure its
heartbeat reports. The autoscaler's tokens-in-flight trigger sums it over a pool. Exported by the
middleware only, so by real vLLM and simulated replicas alike."""
REPLICA_QUEUE_DEPTH = "modelfleet_replica_queue_depth"
"""Gauge, requests: requests a replica holds without a first token (the middleware's count)."""
REPLICA_RUNNING = "modelfleet_replica_running"
"""Gauge, requests: requests a replica is streaming (the middleware's count)."""
REPLICA_REQUESTS = "modelfleet_replica_requests_total"
"""Counter, requests: chat requests by ``model_version``, ``traffic`` and ``outcome``
(``finished``, ``rejected``, ``error``, ``client_disconnect``, ``retried``, ``draining``)."""
REPLICA_TTFT = "modelfleet_replica_ttft_seconds"
"""Histogram, model seconds: arrival to first token at the middleware (:data:`TTFT_BUCKETS`)."""
REPLICA_OUTPUT_TOKENS = "modelfleet_replica_output_tokens"
"""Histogram, tokens: completion tokens of finished answers (:data:`OUTPUT_TOKEN_BUCKETS`)."""
REFUSALS = "modelfleet_refusals_total"
"""Counter, answers: finished answers that open with a refusal, by ``model_version`` and
``traffic``."""

# --------------------------------------------------------------------------- the simulated engine's

REPLICA_INFO = "modelfleet_replica_info"
"""Gauge, always 1: a simulated replica's identity (``model_version``, ``replica_id``,
``region``)."""
REPLICA_GPUS = "modelfleet_replica_gpus"
"""Gauge, GPUs: a replica's GPUs, read by ``rules/online.yml`` where a deployment exports it (no
modelfleet component does yet; a replica without it counts as one GPU)."""

# --------------------------------------------------------------------------- gateway_ext's

GATEWAY_TEAM_TOKENS = "modelfleet_gateway_team_tokens_total"
"""Counter, tokens: tokens a team used, by ``team``, ``model`` and ``kind``."""
GATEWAY_TEAM_BUCKET_TOKENS = "modelfleet_gateway_team_bucket_tokens_total"
"""Counter, tokens: bucket tokens by ``team``, ``model`` and ``event``."""
GATEWAY_TEAM_REJECTED = "modelfleet_gateway_team_rejected_total"
"""Counter, requests: 429s by ``team``, ``model`` and ``reason``."""
GATEWAY_TEAM_SHED = "modelfleet_gateway_team_shed_total"
"""Counter, requests: 503s (shed) by ``team``, ``model`` and ``tier``."""
GATEWAY_POOL_QUEUE_DEPTH = "modelfleet_gateway_pool_queue_depth"
"""Gauge, requests: requests one gateway_ext pod holds in its admission queue for a pool, by
``pool`` and ``tier`` (the queue trigger's gateway part)."""
GATEWAY_POOL_ADMITTED = "modelfleet_gateway_pool_admitted_total"
"""Counter, requests: requests admitted to a pool, by ``pool`` and ``tier``."""
GATEWAY_POOL_QUEUE_WAIT = "modelfleet_gateway_pool_queue_wait_seconds"
"""Histogram, seconds: time a request waited queued, by ``pool`` and ``tier``
(:data:`QUEUE_WAIT_BUCKETS`)."""
GATEWAY_POOL_TOKENS_IN_FLIGHT = "modelfleet_gateway_pool_tokens_in_flight"
"""Gauge, tokens: tokens reserved by the requests this gateway pod admitted to a pool and not yet
settled (its own view, not the replicas' :data:`TOKENS_IN_FLIGHT`)."""
GATEWAY_POOL_CAPACITY = "modelfleet_gateway_pool_capacity_tokens"
"""Gauge, tokens: a pool's admission capacity in tokens in flight."""
GATEWAY_STORE_FALLBACKS = "modelfleet_gateway_bucket_store_fallbacks_total"
"""Counter, calls: bucket-store calls that failed and fell back to per-process buckets, by
``op``."""
GATEWAY_REPLICA_PICKS = "modelfleet_gateway_replica_picks_total"
"""Counter, requests: replicas picked, by ``pool`` and ``reason``."""
GATEWAY_CONVERSATION_PINS = "modelfleet_gateway_conversation_pins_total"
"""Counter, resolutions: conversation version pins, by ``outcome`` (``new``, ``kept``)."""
GATEWAY_ROUTER_STATE_AGE = "modelfleet_gateway_router_state_age_seconds"
"""Gauge, seconds: age of the router state in force (-1: none yet)."""

# --------------------------------------------------------------------------- the batch service's

BATCH_LINES = "modelfleet_batch_lines_total"
"""Counter, lines: batch lines ended, by ``team``, ``model`` and ``outcome``."""
BATCH_REQUESTS = "modelfleet_batch_requests_total"
"""Counter, requests: batch requests sent (every attempt), by ``team``, ``model`` and ``tier``."""
BATCH_THROTTLED = "modelfleet_batch_throttled_total"
"""Counter, answers: 429/503 answers (or ``unreachable``), by ``team``, ``model`` and
``status``."""
BATCH_BATCHES = "modelfleet_batch_batches_total"
"""Counter, batches: batches that reached a final status, by ``team`` and ``status``."""
BATCH_AT_RISK = "modelfleet_batch_at_risk_batches"
"""Gauge, batches: running batches forecast to miss their deadline, by ``team``."""
BATCH_PAUSED = "modelfleet_batch_paused_batches"
"""Gauge, batches: running batches waiting out a Retry-After, by ``team``."""

# --------------------------------------------------------------------------- the whole set

HISTOGRAMS = frozenset({VLLM_TTFT, VLLM_ITL, VLLM_E2E, REPLICA_TTFT, REPLICA_OUTPUT_TOKENS,
                        GATEWAY_POOL_QUEUE_WAIT})
"""The histograms, by family name."""
METRICS = frozenset({
    VLLM_RUNNING, VLLM_WAITING, VLLM_KV_CACHE_USAGE, VLLM_GPU_CACHE_USAGE,
    VLLM_PREFIX_CACHE_QUERIES, VLLM_PREFIX_CACHE_HITS, VLLM_PROMPT_TOKENS, VLLM_GENERATION_TOKENS,
    VLLM_PREEMPTIONS, VLLM_REQUEST_SUCCESS,
    TOKENS_IN_FLIGHT, REPLICA_QUEUE_DEPTH, REPLICA_RUNNING, REPLICA_REQUESTS, REFUSALS,
    REPLICA_INFO, REPLICA_GPUS,
    GATEWAY_TEAM_TOKENS, GATEWAY_TEAM_BUCKET_TOKENS, GATEWAY_TEAM_REJECTED, GATEWAY_TEAM_SHED,
    GATEWAY_POOL_QUEUE_DEPTH, GATEWAY_POOL_ADMITTED, GATEWAY_POOL_TOKENS_IN_FLIGHT,
    GATEWAY_POOL_CAPACITY, GATEWAY_STORE_FALLBACKS, GATEWAY_REPLICA_PICKS,
    GATEWAY_CONVERSATION_PINS, GATEWAY_ROUTER_STATE_AGE,
    BATCH_LINES, BATCH_REQUESTS, BATCH_THROTTLED, BATCH_BATCHES, BATCH_AT_RISK, BATCH_PAUSED,
}) | HISTOGRAMS
"""Every metric the platform writes or reads (counters with ``_total``, histograms by family)."""
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")
"""The series of a histogram, after its family name."""


def declared(series: str) -> bool:
    """Whether ``series``, a name as PromQL and the text exposition spell it (a gauge, a counter
    with ``_total``, a histogram's ``_bucket``, ``_count`` or ``_sum``), is declared here."""
    if series in METRICS:
        return True
    return any(series.endswith(s) and series[: -len(s)] in HISTOGRAMS
               for s in HISTOGRAM_SUFFIXES)
