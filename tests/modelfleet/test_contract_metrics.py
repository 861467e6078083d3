"""One spelling per metric and label: ``modelfleet.contract.metrics`` against everything that
writes or reads them.

The Prometheus rules (``rules/*.yml``, and their promtool tests) cannot import Python, so their
PromQL is parsed here and every metric and label it names must be declared in the contract
(or, for a recording rule's output, recorded by the rules): a rename in the contract that a rule
does not follow fails here instead of leaving an alert silently empty. The same holds for the
PromQL the autoscaler (KEDA's triggers) and the rollout guard build, and for what each exporter
actually exports.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from envoy_control.rollouts.prom import queries_for
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from autoscale.naming import pod_monitor, queue_depth_query, tokens_in_flight_query
from autoscale.promconfig import ReplicaTarget, prometheus_config
from autoscale.scaledobject import scaled_objects
from batch.metrics import make_batch_metrics
from gateway_ext.metrics import make_metrics
from modelfleet.config.load import load_config
from modelfleet.contract import metrics as contract
from replica.clock import ManualClock
from replica.engine import Engine
from replica.metrics import ReplicaMetrics
from replica.params import CHAT_7B
from replica_middleware.inflight import Load
from replica_middleware.metrics import MiddlewareMetrics

REPO = Path(__file__).resolve().parents[2]
RULE_FILES = sorted((REPO / "rules").glob("*.yml"))
RULE_TEST_FILES = sorted((REPO / "rules" / "tests").glob("*.yml"))

# ----------------------------------------------------------------------------- a PromQL reader

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_RANGE = re.compile(r"\[[^\]]*\]")
_TOKEN = re.compile(r"\d+(?:ms|[smhdwy])\b|\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|[A-Za-z_:][A-Za-z0-9_:]*"
                    r"|=~|!~|!=|==|>=|<=|\S")
_LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_KEYWORDS = _LABEL_LISTS | {"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2"}


def promql_names(expr: str) -> tuple[set[str], set[str]]:
    """The metric names and the label names an expression uses (matchers, ``by``/``on`` lists).
    Strings and range durations are dropped first; a name followed by ``(`` (or an aggregation's
    ``by``/``without``) is a function."""
    tokens = _TOKEN.findall(_RANGE.sub("", _STRING.sub('""', expr)))
    metrics: set[str] = set()
    labels: set[str] = set()
    i = 0
    while i < len(tokens):
        t, nxt = tokens[i], tokens[i + 1] if i + 1 < len(tokens) else ""
        if t == "{":  # a selector's matchers: every name inside is a label
            i += 1
            while i < len(tokens) and tokens[i] != "}":
                if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", tokens[i]) and \
                        tokens[i + 1] in ("=", "!=", "=~", "!~"):
                    labels.add(tokens[i])
                i += 1
        elif t in _LABEL_LISTS and nxt == "(":
            i += 2
            while i < len(tokens) and tokens[i] != ")":
                if tokens[i] != ",":
                    labels.add(tokens[i])
                i += 1
        elif re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", t) and t not in _KEYWORDS \
                and nxt not in ("(", "by", "without"):
            metrics.add(t)
        i += 1
    return metrics, labels


def test_the_promql_reader_finds_metrics_and_labels() -> None:
    expr = ('(modelfleet:version:error_ratio:rate5m > on (model) group_left () '
            '(min by (model) (x:y) + 0.005)) and on (model, version) '
            'sum by (namespace, pool, le) (rate(vllm:time_to_first_token_seconds_bucket'
            '{finished_reason!~"stop|length", pool="a@b"}[5m] offset 1h)) * 1e6 or vector(0)')
    assert promql_names(expr) == (
        {"modelfleet:version:error_ratio:rate5m", "x:y", "vllm:time_to_first_token_seconds_bucket"},
        {"model", "version", "namespace", "pool", "le", "finished_reason"})
    assert promql_names('sum(increase(a_total{m="x",v="y"}[30s])) / sum(b_count)') == (
        {"a_total", "b_count"}, {"m", "v"})


# ----------------------------------------------------------------------------- what is declared


def _rules() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                yield path.name, rule


RECORDED = {rule["record"] for _, rule in _rules() if "record" in rule}
"""Recording rules' outputs: names the rules themselves define."""


def undeclared(exprs: dict[str, str]) -> dict[str, list[str]]:
    """``where`` -> the metric and label names of its expression the contract lacks."""
    out = {}
    for where, expr in exprs.items():
        metrics, labels = promql_names(expr)
        missing = sorted({m for m in metrics if not contract.declared(m) and m not in RECORDED}
                         | {f"label {lb}" for lb in labels if lb not in contract.LABELS})
        if missing:
            out[where] = missing
    return out


def test_a_name_the_contract_lacks_is_caught() -> None:
    # the old spelling of tokens in flight, and the engine's unrelated label, are not declared
    assert undeclared({"old": 'sum(modelfleet_tokens_in_flight{pool="chat-7b@v13"})',
                       "label": 'sum by (instance) (vllm:num_requests_waiting)'}) == {
        "old": ["modelfleet_tokens_in_flight"], "label": ["label instance"]}
    assert not contract.declared("modelfleet_tokens_in_flight")
    assert contract.declared(f"{contract.VLLM_TTFT}_bucket")
    assert not contract.declared(f"{contract.VLLM_REQUEST_SUCCESS}_bucket")  # not a histogram


def test_every_rule_expression_uses_declared_names() -> None:
    assert {p.name for p in RULE_FILES} == {"guard.yml", "online.yml"}
    exprs = {f"{name}: {rule.get('record') or rule['alert']}": rule["expr"]
             for name, rule in _rules()}
    assert len(exprs) == 29
    assert undeclared(exprs) == {}


def test_every_rule_test_uses_declared_names() -> None:
    # promtool's input series and expected samples must follow a rename too, or its tests
    # would feed rules series that no replica exports
    exprs: dict[str, str] = {}
    for path in RULE_TEST_FILES:
        for k, test in enumerate(yaml.safe_load(path.read_text())["tests"]):
            for j, series in enumerate(test.get("input_series", [])):
                exprs[f"{path.name}[{k}] series {j}"] = series["series"]
            for j, case in enumerate(test.get("promql_expr_test", [])):
                exprs[f"{path.name}[{k}] expr {j}"] = case["expr"]
                for n, sample in enumerate(case.get("exp_samples", [])):
                    exprs[f"{path.name}[{k}] expr {j} sample {n}"] = sample["labels"]
    assert len(exprs) > 40
    # input series carry the scrape's ``instance``, which no query reads
    found = {where: [m for m in missing if m != "label instance"]
             for where, missing in undeclared(exprs).items()}
    assert {where: missing for where, missing in found.items() if missing} == {}


def test_the_queries_the_autoscaler_and_the_rollout_guard_build_use_declared_names() -> None:
    config = load_config(REPO / "config").config
    exprs = {f"{so['metadata']['labels']['modelfleet.io/region']}/{so['metadata']['name']} "
             f"{t['name']}": t["metadata"]["query"]
             for so in scaled_objects(config) for t in so["spec"]["triggers"]
             if t["type"] == "prometheus"}
    assert len(exprs) == 2 * len(config.pools)
    exprs |= {f"guard {name}": q for name, q in queries_for("chat-7b", "v14", 300).items()}
    assert undeclared(exprs) == {}
    metrics, _ = promql_names(" + ".join(exprs.values()))
    assert contract.TOKENS_IN_FLIGHT in metrics


def test_the_pool_label_has_one_spelling_in_the_queries_and_the_scrapes() -> None:
    # every pool selector in the triggers, the static scrape labels and the PodMonitor's
    # relabelling name a pool model@version, as gateway_ext does
    tokens = tokens_in_flight_query("modelfleet", "chat-7b", "v1.2")
    queue = queue_depth_query("modelfleet", "chat-7b", "v1.2")
    assert re.findall(r'pool="([^"]*)"', tokens + queue) == ["chat-7b@v1.2"] * 3
    target = prometheus_config([ReplicaTarget("127.0.0.1:1", "chat-7b", "v1.2")],
                               namespace="modelfleet")["scrape_configs"][0]["static_configs"][0]
    assert target["labels"][contract.POOL_LABEL] == contract.pool_label_value("chat-7b", "v1.2")
    (relabel,) = [r for r in pod_monitor("modelfleet")["spec"]["podMetricsEndpoints"][0]["relabelings"]
                  if r["targetLabel"] == contract.POOL_LABEL]
    assert relabel["separator"] == contract.POOL_SEPARATOR
    assert [s.rsplit("_", 1)[-1] for s in relabel["sourceLabels"]] == ["model", "version"]


# ----------------------------------------------------------------------------- the exporters


def _exported(text: str) -> tuple[set[str], set[str]]:
    names, labels = set(), set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.endswith("_created"):
                names.add(sample.name)
            labels |= set(sample.labels)
    return names, labels


def _exporters() -> dict[str, str]:
    replica = ReplicaMetrics("chat-7b", Engine(CHAT_7B, ManualClock()).stats,
                             {contract.MODEL_VERSION_LABEL: "chat-7b@v13",
                              contract.REPLICA_ID_LABEL: "r0", contract.REGION_LABEL: "local"})
    middleware = MiddlewareMetrics(lambda: Load(10, 1, 1))
    middleware.record("v13", False, "finished", 0.2, 12, refused=True)
    gateway_registry = CollectorRegistry(auto_describe=False)
    gw = make_metrics(gateway_registry)
    gw.pool_admitted.labels("chat-7b@v13", "standard").inc()
    gw.pool_queue_wait.labels("chat-7b@v13", "standard").observe(0.1)
    gw.pool_queue_depth.labels("chat-7b@v13", "standard").set(1)
    gw.pool_tokens_in_flight.labels("chat-7b@v13").set(1)
    gw.pool_capacity.labels("chat-7b@v13").set(1)
    gw.team_tokens.labels("search", "chat-7b", "prompt").inc()
    gw.team_bucket_tokens.labels("search", "chat-7b", "reserved").inc()
    gw.team_rejected.labels("search", "chat-7b", "tokens").inc()
    gw.team_shed.labels("search", "chat-7b", "batch").inc()
    gw.store_fallbacks.labels("reserve").inc()
    gw.picks.labels("chat-7b@v13", "affinity").inc()
    gw.pins.labels("new").inc()
    batch_registry = CollectorRegistry(auto_describe=False)
    b = make_batch_metrics(batch_registry)
    b.lines.labels("search", "chat-7b", "completed").inc()
    b.requests.labels("search", "chat-7b", "batch").inc()
    b.throttled.labels("search", "chat-7b", "429").inc()
    b.batches.labels("search", "completed").inc()
    b.at_risk.labels("search").set(0)
    b.paused.labels("search").set(0)
    return {"replica": replica.render().decode(), "middleware": middleware.render().decode(),
            "gateway": generate_latest(gateway_registry).decode(),
            "batch": generate_latest(batch_registry).decode()}


@pytest.mark.parametrize("exporter", ["replica", "middleware", "gateway", "batch"])
def test_every_exported_name_is_declared(exporter: str) -> None:
    names, labels = _exported(_exporters()[exporter])
    assert names and {n for n in names if not contract.declared(n)} == set()
    assert labels - contract.LABELS == set()


def test_every_declared_metric_has_one_exporter_but_those_read_from_elsewhere() -> None:
    exported: dict[str, list[str]] = {}
    for who, text in _exporters().items():
        for family in text_string_to_metric_families(text):
            name = family.name + ("_total" if family.type == "counter" else "")
            exported.setdefault(name, []).append(who)
    assert {n: w for n, w in exported.items() if len(w) > 1} == {}  # one series per quantity
    assert exported[contract.TOKENS_IN_FLIGHT] == ["middleware"]
    read_only = {contract.VLLM_GPU_CACHE_USAGE, contract.REPLICA_GPUS}  # other vLLMs, deployments
    assert contract.METRICS - set(exported) == read_only


def test_vllms_own_names_are_spelled_as_vllm_exports_them() -> None:
    # the one place the vLLM spellings are written out: what real vLLM's /metrics carries
    assert (contract.VLLM_RUNNING, contract.VLLM_WAITING, contract.VLLM_KV_CACHE_USAGE,
            contract.VLLM_GPU_CACHE_USAGE, contract.VLLM_PREFIX_CACHE_QUERIES,
            contract.VLLM_PREFIX_CACHE_HITS, contract.VLLM_PROMPT_TOKENS,
            contract.VLLM_GENERATION_TOKENS, contract.VLLM_PREEMPTIONS,
            contract.VLLM_REQUEST_SUCCESS, contract.VLLM_TTFT, contract.VLLM_ITL,
            contract.VLLM_E2E) == (
        "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc", "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total", "vllm:num_preemptions_total",
        "vllm:request_success_total", "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds")
    assert (contract.MODEL_NAME_LABEL, contract.ENGINE_LABEL, contract.FINISHED_REASON_LABEL,
            contract.FINISHED_REASONS) == ("model_name", "engine", "finished_reason",
                                           ("stop", "length", "abort"))


# ----------------------------------------------------------------------------- no literals left

WRITERS_AND_READERS = [
    "replica/metrics.py", "replica_middleware/metrics.py", "replica_middleware/heartbeat.py",
    "gateway_ext/metrics.py", "batch/metrics.py", "envoy/rollouts/prom.py",
    "modelfleet/local/autoscaler_readings.py",
    *sorted(str(p.relative_to(REPO)) for p in (REPO / "autoscale").glob("*.py")),
    *sorted(str(p.relative_to(REPO)) for p in (REPO / "components" / "k8s").glob("*.py")),
]
_METRIC_LITERAL = re.compile(r"vllm:[a-z_]+|\bmodelfleet_[a-z_]+")


def test_writers_and_readers_spell_no_metric_name_themselves() -> None:
    found = {}
    for rel in WRITERS_AND_READERS:
        tree = ast.parse((REPO / rel).read_text())
        docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
        hits = [n.value for n in ast.walk(tree)
                if isinstance(n, ast.Constant) and isinstance(n.value, str)
                and id(n) not in docs and _METRIC_LITERAL.search(n.value)]
        if hits:
            found[rel] = hits
    assert found == {}
