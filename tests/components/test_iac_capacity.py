"""The capacity plan against the pools, the warm headroom and the GPU demand (pure)."""

from __future__ import annotations

import pytest

from components.capacity import CapacityError, check_pool_maxima, gpu_demand, model_needs
from components.k8s.engine_args import QUANTIZATION, precision_args
from modelfleet.config import PlatformConfig


def test_plan_figures_per_region(config: PlatformConfig) -> None:
    needs = model_needs(config)
    # the seed: 30,000 tokens/s / 2,500 = 12 chat replicas; 1,200 / 400 = 3 reasoning replicas
    assert {m: n.peak_replicas for m, n in needs.items()} == {"chat-7b": 12, "reason-70b": 3}
    # one cold start of growth at peak: ceil(12 x 0.34) = 5, ceil(3 x 0.34) = 2 (docs/autoscaling.md)
    assert {m: n.warm_replicas for m, n in needs.items()} == {"chat-7b": 5, "reason-70b": 2}


@pytest.mark.parametrize("region", ["us-east-1", "eu-west-1"])
def test_the_example_pools_carry_the_peak_alone(config: PlatformConfig, region: str) -> None:
    assert set(check_pool_maxima(config, region)) == {"chat-7b", "reason-70b"}


def test_a_pool_below_the_plan_fails_clearly(config: PlatformConfig) -> None:
    pools = tuple(p.model_copy(update={"max_replicas": 10}) if p.key == "chat-7b@v13" and p.region == "eu-west-1"
                  else p for p in config.pools)
    with pytest.raises(CapacityError, match=r"eu-west-1: pool chat-7b@v13 has max_replicas 10, below "
                                            r"the capacity plan's 12 replicas of chat-7b"):
        check_pool_maxima(config.model_copy(update={"pools": pools}), "eu-west-1")


def test_the_canary_pool_does_not_count_towards_the_peak(config: PlatformConfig) -> None:
    pools = tuple(p for p in config.pools if not (p.key == "chat-7b@v13" and p.region == "us-east-1"))
    with pytest.raises(CapacityError, match="no pool of chat-7b@v13"):
        check_pool_maxima(config.model_copy(update={"pools": pools}), "us-east-1")


def test_a_slower_load_test_raises_the_plan(config: PlatformConfig) -> None:
    slow = tuple(v.model_copy(update={"capacity": v.capacity.model_copy(update={"output_tokens_per_s": 800})})
                 if v.key == "chat-7b@v13" else v for v in config.versions)
    needs = model_needs(config.model_copy(update={"versions": slow}))
    assert needs["chat-7b"].peak_replicas == 38  # the seed's 800 tokens/s figure
    with pytest.raises(CapacityError, match="below the capacity plan's 38"):
        check_pool_maxima(config.model_copy(update={"versions": slow}), "us-east-1")


def test_gpu_demand(config: PlatformConfig) -> None:
    (demand,) = gpu_demand(config, "us-east-1", model_needs(config)).values()
    assert (demand.gpu_type, demand.min_gpus, demand.max_gpus, demand.warm_gpus) == ("a100-80gb", 11, 28, 9)


def test_quantization_per_precision() -> None:
    assert QUANTIZATION == {"fp16": None, "int8": "compressed-tensors", "4bit": "awq_marlin"}


def test_precision_flags(config: PlatformConfig) -> None:
    v = config.version("reason-70b", "v1")
    assert v is not None
    assert precision_args(v) == ["--dtype", "float16", "--quantization", "compressed-tensors"]
    assert precision_args(v.model_copy(update={"precision": "4bit"}))[-1] == "awq_marlin"
    assert precision_args(v.model_copy(update={"precision": "fp16"})) == ["--dtype", "float16"]
