"""ModelPool: one Deployment and one ScaledObject per pool, engine flags, probes, drain, weights."""

from __future__ import annotations

import re
from typing import Any

import pytest

from autoscale.naming import pod_labels
from components.k8s.model_pool import ModelPool, ModelPoolArgs
from components.settings import Images
from components.testing import Build, objects, pool_of
from components.validation import invalid_objects
from modelfleet.config import PlatformConfig


def _args(config: PlatformConfig, images: Images, key: str, **changes: Any) -> ModelPoolArgs:
    pool, version, model = pool_of(config, key)
    if changes:
        version = version.model_copy(update=changes)
    return ModelPoolArgs(pool, version, model, "modelfleet", images, "modelfleet-weights",
                         "http://control-plane.modelfleet.svc.cluster.local:8081")


def _engine(deployment: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def _flag(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


@pytest.mark.parametrize("key", ["chat-7b@v13", "chat-7b@v14", "reason-70b@v1"])
def test_one_deployment_and_one_scaled_object_per_pool(build: Build, config: PlatformConfig,
                                                       images: Images, key: str) -> None:
    mocks = build(lambda: ModelPool(key, _args(config, images, key)))
    (dep,), (so,) = objects(mocks, "Deployment"), objects(mocks, "ScaledObject")
    pool, _, _ = pool_of(config, key)
    assert so["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
    assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == (pool.min_replicas, pool.max_replicas)
    assert dep["spec"]["replicas"] == pool.min_replicas
    assert [o["kind"] for o in mocks.kubernetes_objects()].count("Service") == 1
    assert len(objects(mocks, "PodDisruptionBudget")) == len(objects(mocks, "PodMonitor")) == 1
    assert invalid_objects(mocks.kubernetes_objects()) == {}
    assert [r.type for r in mocks.resources if not r.custom] == ["modelfleet:k8s:ModelPool"]


def test_70b_int8_on_two_gpus(build: Build, config: PlatformConfig, images: Images) -> None:
    mocks = build(lambda: ModelPool("reason", _args(config, images, "reason-70b@v1")))
    engine = _engine(objects(mocks, "Deployment")[0])
    args = engine["args"]
    assert engine["command"] == ["vllm", "serve"] and args[0] == "/weights/reason-70b/v1"
    assert _flag(args, "--tensor-parallel-size") == "2"
    assert _flag(args, "--quantization") == "compressed-tensors"  # W8A8-INT8 checkpoint
    assert _flag(args, "--dtype") == "float16"
    assert _flag(args, "--max-model-len") == "16384"
    env = {e["name"]: e.get("value") for e in engine["env"]}
    assert env["MODELFLEET_SETTLE_URL"].endswith(".svc:8080/v1/settle")  # usage reaches gateway_ext
    assert args[args.index("--served-model-name") + 1: args.index("--served-model-name") + 3] == \
        ["reason-70b", "reason-70b@v1"]
    assert "--enable-prefix-caching" in args
    assert _flag(args, "--middleware") == "replica_middleware.middleware.ModelfleetMiddleware"
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert engine["resources"]["requests"]["nvidia.com/gpu"] == "2"


def test_chat_fp16_on_one_gpu_is_not_quantized(build: Build, config: PlatformConfig, images: Images) -> None:
    mocks = build(lambda: ModelPool("chat", _args(config, images, "chat-7b@v13")))
    engine = _engine(objects(mocks, "Deployment")[0])
    assert _flag(engine["args"], "--tensor-parallel-size") == "1"
    assert "--quantization" not in engine["args"] and _flag(engine["args"], "--dtype") == "float16"
    assert engine["image"] == "registry.test/modelfleet/vllm:t1"


def test_probes_drain_and_gpu_scheduling(build: Build, config: PlatformConfig, images: Images) -> None:
    mocks = build(lambda: ModelPool("chat", _args(config, images, "chat-7b@v13")))
    dep = objects(mocks, "Deployment")[0]
    pod, engine = dep["spec"]["template"]["spec"], _engine(dep)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert engine[probe]["httpGet"] == {"path": "/health", "port": "http"}
    assert engine["startupProbe"]["periodSeconds"] * engine["startupProbe"]["failureThreshold"] >= 300
    # docs/autoscaling.md: chat-7b stream bound 137 s, preStop 12 s, grace 159 s
    assert pod["terminationGracePeriodSeconds"] == 159
    assert engine["lifecycle"]["preStop"] == {"sleep": {"seconds": 12}}
    assert _flag(engine["args"], "--shutdown-timeout") == "137"
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true", "modelfleet.io/gpu-type": "a100-80gb"}
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in engine["volumeMounts"]
    assert dep["spec"]["selector"]["matchLabels"] == pod_labels("chat-7b", "v13")


def test_weights_are_fetched_and_checked_before_the_engine(build: Build, config: PlatformConfig,
                                                           images: Images) -> None:
    mocks = build(lambda: ModelPool("reason", _args(config, images, "reason-70b@v1")))
    pod = objects(mocks, "Deployment")[0]["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    script = init["command"][-1]
    assert 's3://modelfleet-weights/reason-70b/v1-int8/' in script
    want = "9e2d7eac10f468134f7b50a7fabe0326704e16b116878939f63f9844d9cf0cd3"
    assert f'want="{want}"' in script and "sha256sum --quiet --strict -c MANIFEST.sha256" in script
    assert script.index("aws s3 sync") < script.index("sha256sum") < script.index('echo "$want" > "$dest/.verified"')
    weights = next(v for v in pod["volumes"] if v["name"] == "weights")
    assert weights["hostPath"]["path"] == "/mnt/nvme/modelfleet/weights"
    assert {"name": "weights", "mountPath": "/weights", "readOnly": True} in _engine(
        objects(mocks, "Deployment")[0])["volumeMounts"]


def test_sglang_variant(build: Build, config: PlatformConfig, images: Images) -> None:
    args = _args(config, images, "chat-7b@v14", engine="sglang")
    mocks = build(lambda: ModelPool("chat-sglang", args))
    engine = _engine(objects(mocks, "Deployment")[0])
    assert engine["command"] == ["python3", "-m", "sglang.launch_server"]
    assert _flag(engine["args"], "--model-path") == "/weights/chat-7b/v14"
    assert _flag(engine["args"], "--tp-size") == "1"
    assert engine["image"] == "registry.test/modelfleet/sglang:t1"
    assert "--middleware" not in engine["args"] and len(objects(mocks, "ScaledObject")) == 1
    assert invalid_objects(mocks.kubernetes_objects()) == {}


def test_pool_and_version_must_match(build: Build, config: PlatformConfig, images: Images) -> None:
    pool, _, model = pool_of(config, "chat-7b@v13")
    _, other, _ = pool_of(config, "chat-7b@v14")
    bad = ModelPoolArgs(pool, other, model, "modelfleet", images, "b", "http://cp")
    with pytest.raises(ValueError, match="not served by version"):
        build(lambda: ModelPool("bad", bad))


def test_weights_must_be_in_s3(build: Build, config: PlatformConfig, images: Images) -> None:
    args = _args(config, images, "chat-7b@v13", weights_uri="hf://org/chat-7b")
    with pytest.raises(ValueError, match="must be s3://"):
        build(lambda: ModelPool("bad", args))


def _relabel(relabelings: list[dict[str, Any]], pod: dict[str, str]) -> dict[str, str]:
    """Prometheus' ``replace`` relabelling (the default action) of a pod's discovered labels."""
    meta = {"__meta_kubernetes_pod_label_" + "".join(c if c.isalnum() else "_" for c in k): v
            for k, v in pod.items()}
    return {r["targetLabel"]: r.get("separator", ";").join(meta.get(s, "") for s in r["sourceLabels"])
            for r in relabelings}


@pytest.mark.parametrize("key", ["chat-7b@v13", "chat-7b@v14", "reason-70b@v1"])
def test_the_pods_scraped_pool_label_is_what_the_scaled_object_selects(
        build: Build, config: PlatformConfig, images: Images, key: str) -> None:
    # the pod label holds the DNS-safe name (no '@'); the PodMonitor joins model and version,
    # so the series carry pool="model@version", the spelling the triggers and gateway_ext use
    mocks = build(lambda: ModelPool(key, _args(config, images, key)))
    (dep,), (so,), (monitor,) = (objects(mocks, k) for k in ("Deployment", "ScaledObject", "PodMonitor"))
    pod = dep["spec"]["template"]["metadata"]["labels"]
    assert "@" not in pod["modelfleet.io/pool"]
    scraped = _relabel(monitor["spec"]["podMetricsEndpoints"][0]["relabelings"], pod)
    assert scraped["pool"] == key
    for trigger in (t for t in so["spec"]["triggers"] if t["type"] == "prometheus"):
        assert set(re.findall(r'pool="([^"]*)"', trigger["metadata"]["query"])) == {key}
