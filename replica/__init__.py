"""The simulated vLLM replica: an OpenAI-compatible server over a continuous-batching engine model.

Pure parts, shared with the discrete-event simulator (no I/O, no asyncio, time from a clock):

- ``replica.params``: ``EngineParams`` (plain numbers per model version), presets, step-time model
- ``replica.engine``: ``Engine``, stepped by a driver; ``EngineRequest``, ``StepResult``, ``EngineStats``
- ``replica.kv_cache``: ``BlockPool``, KV blocks with an LRU prefix cache
- ``modelfleet.contract.tokens``, ``replica.generation``: simulated tokenizer, chat template, deterministic answers
- ``replica.workload``: the seed's request shape and a closed-loop load test in model time

The edges: ``replica.server.create_app`` (the ASGI app), ``replica.driver`` (the engine against
the wall clock), ``python -m replica`` (the CLI), ``replica.testing`` (a server in a thread).
"""

from replica.clock import Clock, ManualClock
from replica.engine import Engine
from replica.engine_types import EngineRequest, EngineStats, StepResult
from replica.params import CHAT_7B, PRESETS, REASON_70B, EngineParams, params_from_json, preset

__all__ = [
    "CHAT_7B",
    "PRESETS",
    "REASON_70B",
    "Clock",
    "Engine",
    "EngineParams",
    "EngineRequest",
    "EngineStats",
    "ManualClock",
    "StepResult",
    "params_from_json",
    "preset",
]
