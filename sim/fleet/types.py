"""The simulator's plain data for one region: the live pool's spec and window, another version's
pool (a canary) with its faults, and one request in the region."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway_ext.decision import Admitted
from gateway_ext.limits.admission_types import AdmissionConfig
from replica.params import EngineParams
from sim.fleet.clients import RetryPolicy
from sim.fleet.gateway import Routing
from sim.fleet.measures import RequestRow
from sim.fleet.scaling import ScalerSetup
from sim.traces.arrivals import Arrival


@dataclass(frozen=True)
class VersionSpec:
    """Another version's pool in the region (a canary), with its faults: ``error_share`` of its
    answers are a 500 before any token, ``output_factor`` scales its answers (up to the
    request's max_tokens)."""

    version: str
    params: EngineParams
    capacity_tokens_per_replica: int
    error_share: float = 0.0
    output_factor: float = 1.0


@dataclass(frozen=True)
class FleetSpec:
    """The live pool of one region and the run's window; units in the names."""

    params: EngineParams
    replicas: int = 12
    routing: Routing = Routing.AFFINITY
    bound: float = 1.25
    model: str = "chat-7b"
    version: str = "v13"
    capacity_tokens_per_replica: int = 112_000
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    warmup_s: float = 60.0
    duration_s: float = 300.0
    tail_s: float = 30.0
    """Seconds simulated after the window so that its last requests can finish."""
    heartbeat_s: float = 1.0
    scaler: ScalerSetup | None = None
    seed: int = 0
    gateway: bool = True
    """False: a load test straight at the replicas (no buckets, no admission; picking only)."""
    retry: RetryPolicy | None = None
    """How clients retry refusals and failures; None: they don't (open loop)."""
    region: str = "sim"


class Req:
    __slots__ = ("admitted", "arrival", "attempt", "cached", "first_s", "output", "pool", "row",
                 "t0", "ta")

    """One attempt in the region: the arrival, its gateway admission (None: no gateway), its row,
    the first attempt's arrival ``t0`` and this one's ``ta`` (seconds), the attempt number, its
    pool; then its first token's time, cached tokens and output tokens (the version's)."""

    def __init__(self, arrival: Arrival, admitted: Admitted | None, row: RequestRow | None,
                 t0: float, attempt: int, ta: float, pool: str) -> None:
        self.arrival, self.admitted, self.row, self.t0 = arrival, admitted, row, t0
        self.attempt, self.ta, self.pool = attempt, ta, pool
        self.first_s, self.cached, self.output = -1.0, 0, arrival.output_tokens
