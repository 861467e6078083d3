"""A simulated replica: ``replica.engine.Engine`` on its own manual clock, driven in model time.

The simulator does what ``replica.driver.EngineDriver`` does against the wall clock: start a
step, let model time reach the step's end, deliver the step's tokens, start the next step while
the engine has work. The engine is the one the simulated replica serves with (continuous
batching, KV capacity, prefix cache), so the simulator's replicas behave as ``modelfleet up``'s.

The replica also keeps what its middleware reports: tokens in flight (prompt plus remaining
output of every request held, running or waiting), updated per step without asking the engine
to sum over its requests.
"""

from __future__ import annotations

from enum import StrEnum

from replica.clock import ManualClock
from replica.engine import Engine
from replica.engine_types import EngineRequest, StepResult
from replica.params import EngineParams


class ReplicaState(StrEnum):
    """The seed's replica states."""

    STARTING = "starting"  # node, weights and warm-up: not in the ring yet
    SERVING = "serving"
    DRAINING = "draining"  # out of the ring, finishing its streams


class SimReplica:
    """One replica: its engine, its clock, the step in progress and its tokens in flight."""

    __slots__ = ("clock", "engine", "held", "id", "pool", "ready_s", "state", "step",
                 "tokens_in_flight")

    def __init__(self, replica_id: str, params: EngineParams, ready_s: float = 0.0,
                 state: ReplicaState = ReplicaState.SERVING, pool: str = "") -> None:
        self.id = replica_id
        self.pool = pool
        """The pool (``model@version``) it belongs to."""
        self.clock = ManualClock(ready_s)
        self.engine = Engine(params, self.clock)
        self.state = state
        self.ready_s = ready_s
        """When it serves (seconds); in the future while STARTING."""
        self.step: StepResult | None = None
        """The step in progress: its tokens are delivered at ``step.end_s``."""
        self.held: dict[str, int] = {}
        """Prompt tokens of each request held, by request id."""
        self.tokens_in_flight = 0

    @property
    def busy(self) -> bool:
        """True while a step is in progress."""
        return self.step is not None

    def add(self, request_id: str, prompt_tokens: int, output_tokens: int,
            hashes: tuple[int, ...], now_s: float) -> None:
        """Hand a request to the engine at ``now_s``; raises ``ValueError`` if it can never run
        (longer than ``max_model_len`` or the KV cache)."""
        self.engine.add_request(EngineRequest(request_id, prompt_tokens, output_tokens, hashes),
                                now_s)
        self.held[request_id] = prompt_tokens
        self.tokens_in_flight += prompt_tokens + output_tokens

    def start_step(self, now_s: float) -> StepResult | None:
        """Start the next step at ``now_s`` (seconds); None when there is nothing to run."""
        if self.step is not None or not self.engine.has_work:
            return None
        if now_s > self.clock.now():
            self.clock.set(now_s)
        result = self.engine.step(detail=False)  # no record per token: finishes and counts suffice
        if not result.tokens and result.end_s <= result.start_s:
            return None
        self.step = result
        return result

    def finish_step(self) -> StepResult:
        """The step that just ended (its tokens are due now); the replica is free to step again."""
        result = self.step
        if result is None:
            raise RuntimeError(f"replica {self.id} has no step in progress")
        self.step = None
        self.tokens_in_flight -= result.tokens
        self.clock.set(result.end_s)
        return result

    def release(self, request_id: str) -> None:
        """Forget a finished request: its prompt leaves the tokens in flight."""
        self.tokens_in_flight -= self.held.pop(request_id)

    def abort(self, request_id: str) -> bool:
        """Drop a request (client gone, replica lost): frees its KV blocks. False if not held."""
        held = self.held.pop(request_id, None)
        if held is not None and self.engine.abort(request_id):
            # Rare (failover): recount from the engine rather than track tokens per request.
            self.tokens_in_flight = self.engine.stats().tokens_in_flight
        return held is not None
