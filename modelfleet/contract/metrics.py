"""Metric and label names the platform writes and reads, and the buckets of its histograms.

Every exporter (the replica middleware, the simulated engine, gateway_ext, the batch service) and
every reader (the rollout guard's PromQL, the autoscaler's triggers, the alert rules, the tests)
takes its names from here, so a name has one spelling.
"""

from __future__ import annotations

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
"""Time-to-first-token histogram buckets, in seconds (vLLM's own for
``vllm:time_to_first_token_seconds``; the middleware's TTFT histogram uses the same)."""
