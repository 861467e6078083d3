"""The Pulumi program (``Pulumi.yaml``: ``main: infra/``): reads the stack's config and wires the
components of ``components/`` for one region or for the global layer.

The components themselves arrive with the infrastructure issue; until then the program loads
and checks the declared platform config and exports what the stack would carry, so ``pulumi
preview`` already fails on a config error.
"""

from __future__ import annotations

from pathlib import Path

import pulumi

from modelfleet.config import load_config

stack_cfg = pulumi.Config("modelfleet")
kind = stack_cfg.get("kind") or "region"
config_dir = Path(__file__).resolve().parent.parent / "config"
platform = load_config((stack_cfg.get("configDir") and Path(stack_cfg.require("configDir"))) or config_dir).config

if kind == "region":
    region = stack_cfg.require("region")
    pools = [p for p in platform.pools if p.region == region]
    pulumi.export("region", region)
    pulumi.export(
        "pools",
        [{"pool": p.key, "min_replicas": p.min_replicas, "max_replicas": p.max_replicas} for p in pools],
    )
else:
    pulumi.export("regions", list(platform.regions))
