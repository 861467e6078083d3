"""Prometheus in the loop: the ScaledObjects' exact PromQL against a real Prometheus scraping
fake replicas, and the rule fed with what it returns.

Skipped where Prometheus is not installed, failed instead when CI=true.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from autoscale.naming import pod_labels, pod_monitor
from autoscale.policy import scaler_spec
from autoscale.promconfig import ReplicaTarget, prometheus_config
from autoscale.rule import ScaleReason, ScalerState, desired_replicas
from autoscale.scaledobject import scaled_object
from autoscale.triggers import pool_triggers, readings
from modelfleet.config.autoscaling import AutoscalePolicy
from modelfleet.config.schema import PlatformConfig, Pool, Version
from modelfleet.contract.metrics import NAMESPACE_LABEL

NAMESPACE = "modelfleet"
Query = Callable[[str], float | None]


def _queries(so: dict[str, Any]) -> dict[str, str]:
    """Trigger name -> PromQL, exactly as the ScaledObject carries it."""
    return {t["name"]: t["metadata"]["query"] for t in so["spec"]["triggers"] if t["type"] == "prometheus"}


def _query(url: str) -> Query:
    """Instant query -> the single value, or None for an empty answer (KEDA with
    ``ignoreNullValues: "false"`` reports that as an error, i.e. a failed read)."""
    def run(promql: str) -> float | None:
        answer = httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=5).json()
        assert answer["status"] == "success", answer
        result = answer["data"]["result"]
        assert len(result) <= 1, "a KEDA query must return one element"
        return float(result[0]["value"][1]) if result else None
    return run


def _wait_for(query: Query, promql: str, expected: float, timeout_s: float = 15.0) -> float | None:
    """Poll until ``promql`` returns ``expected`` (scrapes run every second)."""
    deadline, value = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        value = query(promql)
        if value == expected:
            return value
        time.sleep(0.2)
    return value


def _targets(replicas: list[Any]) -> list[ReplicaTarget]:
    """Static targets for the fake replicas (conftest's ``FakeReplica``)."""
    return [ReplicaTarget(r.address, r.model, r.version, replica_id=f"r{i}", namespace=r.namespace)
            for i, r in enumerate(replicas)]


def test_generated_prometheus_config_passes_promtool(promtool: str, tmp_path: Path) -> None:
    config = prometheus_config([ReplicaTarget("127.0.0.1:9000", "chat-7b", "v13")], namespace=NAMESPACE)
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    check = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True,
                           timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.live
def test_scaled_object_queries_drive_the_rule(
        prometheus: Callable[[dict[str, Any]], str], fake_replicas: Callable[..., Any],
        example_config: PlatformConfig, chat_pool: Pool, chat_version: Version,
        policy: AutoscalePolicy, fake_gateway: Any) -> None:
    pool_replicas = [fake_replicas("chat-7b", "v13", NAMESPACE, 300_000, 3),
                     fake_replicas("chat-7b", "v13", NAMESPACE, 250_000, 2)]
    others = [fake_replicas("chat-7b", "v14", NAMESPACE, 999_999, 50),   # same model_name, canary pool
              fake_replicas("chat-7b", "v13", "staging", 777_777, 40)]   # same pool, other namespace
    url = prometheus(prometheus_config(_targets(pool_replicas + others), namespace=NAMESPACE,
                                       gateways=[fake_gateway.address]))
    query = _query(url)

    queries = _queries(scaled_object(chat_pool, chat_version, policy, namespace=NAMESPACE))
    assert _wait_for(query, queries["tokens-in-flight"], 550_000) == 550_000  # 300,000 + 250,000
    assert _wait_for(query, queries["queue-depth"], 5) == 5                   # 3 + 2

    # The rule fed with those values, at the warm minimum of 6: tokens r = 550,000 / (78,400 x 6)
    # = 1.17 -> ceil(7.02) = 8; queue r = 5 / 48 -> 1; the pool goes to 8.
    triggers = pool_triggers(chat_pool, chat_version, policy, NAMESPACE)
    values = {name: query(promql) for name, promql in queries.items()}
    decision = desired_replicas(scaler_spec(chat_pool, policy), ScalerState(),
                                readings(triggers, values, datetime.now(UTC)), 6, 0.0)
    assert (decision.replicas, decision.reason) == (8, ScaleReason.SCALED)

    # A gauge moves: the engines' queue jumps to 60 + 20 = 80 -> ceil(80 / 8) = 10 replicas,
    # the fast trigger (no gateway series yet: the gateway's part counts 0).
    pool_replicas[0].waiting, pool_replicas[1].waiting = 60, 20
    assert _wait_for(query, queries["queue-depth"], 80) == 80
    values = {name: query(promql) for name, promql in queries.items()}
    decision = desired_replicas(scaler_spec(chat_pool, policy), ScalerState(),
                                readings(triggers, values, datetime.now(UTC)), 6, 0.0)
    assert decision.replicas == 10

    # Requests held in the gateway's admission queue for this pool count too (every tier), the
    # canary pool's do not: 80 + 30 + 6 = 116 -> ceil(116 / 8) = 15 proposed; the scale-up rate
    # allows 6 + max(100% of 6, 4 pods) = 12 in this first step.
    fake_gateway.queued("chat-7b@v13", "interactive", 30)
    fake_gateway.queued("chat-7b@v13", "standard", 6)
    fake_gateway.queued("chat-7b@v14", "interactive", 500)
    assert _wait_for(query, queries["queue-depth"], 116) == 116
    values = {name: query(promql) for name, promql in queries.items()}
    decision = desired_replicas(scaler_spec(chat_pool, policy), ScalerState(),
                                readings(triggers, values, datetime.now(UTC)), 6, 0.0)
    assert dict(decision.proposals)["queue-depth"] == 15 and decision.replicas == 12

    # A pool nobody scrapes answers empty, not 0: a failed read, and the rule holds the pool.
    reason = next(p for p in example_config.pools if p.model == "reason-70b" and p.region == "us-east-1")
    reason_version = example_config.version("reason-70b", "v1")
    assert reason_version is not None
    reason_queries = _queries(scaled_object(reason, reason_version, policy, namespace=NAMESPACE))
    values = {name: query(promql) for name, promql in reason_queries.items()}
    assert values == {"tokens-in-flight": None, "queue-depth": None}
    decision = desired_replicas(scaler_spec(reason, policy), ScalerState(),
                                readings(pool_triggers(reason, reason_version, policy, NAMESPACE),
                                         values, datetime.now(UTC)), 3, 0.0)
    assert (decision.replicas, decision.reason) == (3, ScaleReason.METRICS_MISSING)


def _pod_monitor_config(replicas: list[Any], gateway: Any) -> dict[str, Any]:
    """What the Prometheus Operator makes of :func:`autoscale.naming.pod_monitor`, with each
    fake replica as a discovered pod: its pod labels as ``__meta_kubernetes_pod_label_*``, its
    namespace as ``__meta_kubernetes_namespace`` (copied to ``namespace``, as the Operator
    does), then the PodMonitor's own relabelings as they are written. The gateway is scraped
    as :func:`autoscale.naming.gateway_pod_monitor` does: no relabelling."""
    endpoint = pod_monitor(NAMESPACE)["spec"]["podMetricsEndpoints"][0]
    relabel = [{"source_labels": ["__meta_kubernetes_namespace"], "target_label": NAMESPACE_LABEL}]
    for r in endpoint["relabelings"]:
        relabel.append({"source_labels": r["sourceLabels"], "target_label": r["targetLabel"],
                        **({"separator": r["separator"]} if "separator" in r else {})})
    pods = [{"targets": [r.address],
             "labels": {"__meta_kubernetes_namespace": r.namespace,
                        **{"__meta_kubernetes_pod_label_" + "".join(c if c.isalnum() else "_" for c in k): v
                           for k, v in pod_labels(r.model, r.version).items()}}}
            for r in replicas]
    job = {"metrics_path": "/metrics", "scrape_interval": "1s", "scrape_timeout": "1s"}
    return {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {"job_name": "vllm-replicas", **job, "static_configs": pods,
                 "relabel_configs": relabel},
                {"job_name": "gateway-ext", **job, "static_configs": [
                    {"targets": [gateway.address], "labels": {NAMESPACE_LABEL: NAMESPACE}}]}]}


@pytest.mark.live
def test_the_pod_monitors_pool_label_is_the_one_the_gateway_and_the_queries_use(
        prometheus: Callable[[dict[str, Any]], str], fake_replicas: Callable[..., Any],
        chat_pool: Pool, chat_version: Version, policy: AutoscalePolicy,
        fake_gateway: Any) -> None:
    # In a cluster: the PodMonitor's relabelling, not promconfig's static labels, names the
    # pool of a replica's series; the gateway names it itself. One matcher must find both.
    replicas = [fake_replicas("chat-7b", "v13", NAMESPACE, 40_000, 2),
                fake_replicas("chat-7b", "v13", NAMESPACE, 30_000, 1),
                fake_replicas("chat-7b", "v14", NAMESPACE, 999_999, 50)]  # the canary's pool
    fake_gateway.queued("chat-7b@v13", "interactive", 4)
    fake_gateway.queued("chat-7b@v14", "interactive", 500)
    query = _query(prometheus(_pod_monitor_config(replicas, fake_gateway)))
    queries = _queries(scaled_object(chat_pool, chat_version, policy, namespace=NAMESPACE))
    assert _wait_for(query, queries["tokens-in-flight"], 70_000) == 70_000   # 40,000 + 30,000
    assert _wait_for(query, queries["queue-depth"], 7) == 7                  # 2 + 1 engines, 4 gateway
