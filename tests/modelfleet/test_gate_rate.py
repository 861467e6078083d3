"""The gate's load test at rising arrival rates (pure parts): the schedule, the seeded
arrivals, one step's figures from streams and pool samples, and which step is the capacity."""

from __future__ import annotations

import math

import pytest

from modelfleet.release.rate import (
    PoolSample,
    RateStep,
    StreamSample,
    Targets,
    arrivals,
    capacity_of,
    p95,
    schedule,
    search,
    summarise,
)


def step(rate: float, out: float, ttft: float, slow: float = 0.0, held: int = 1000) -> RateStep:
    targets = Targets()
    ok = ttft < targets.ttft_p95_s and slow <= targets.max_slow_share
    return RateStep(rate, 10, 0, ttft, 40.0, slow, out, held, 5, ok, () if ok else ("miss",))


def test_schedule_and_arrivals_are_fixed_by_the_seed() -> None:
    assert schedule(1.0, 1.5, 5) == [1.0, 1.5, 2.25, 3.38, 5.06]
    assert arrivals(4.0, 2.0, poisson=False, seed=0) == [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75]
    a, b = arrivals(10.0, 100.0, poisson=True, seed=3), arrivals(10.0, 100.0, poisson=True, seed=3)
    assert a == b and a != arrivals(10.0, 100.0, poisson=True, seed=4)
    assert 900 < len(a) < 1100 and all(0 < t < 100 for t in a) and a == sorted(a)
    with pytest.raises(ValueError):
        schedule(1.0, 1.0, 3)


def test_p95_is_the_nearest_rank() -> None:
    assert p95([float(i) for i in range(1, 101)]) == 95.0
    assert p95([0.2]) == 0.2 and math.isinf(p95([]))


def test_search_stops_at_the_first_failing_step_and_keeps_the_best_pass() -> None:
    measured = {1.0: step(1.0, 300, 0.2), 2.0: step(2.0, 600, 0.3), 4.0: step(4.0, 1100, 0.6, held=52000),
                8.0: step(8.0, 1500, 3.0), 16.0: step(16.0, 1600, 9.0)}
    ran: list[float] = []

    def run(rate: float) -> RateStep:
        ran.append(rate)
        return measured[rate]

    found = search(run, [1.0, 2.0, 4.0, 8.0, 16.0])
    assert ran == [1.0, 2.0, 4.0, 8.0]  # 16/s never sent: the gate failed at 8/s
    assert found.capacity is not None and found.capacity.rate_per_s == 4.0
    assert (found.capacity.output_tokens_per_s, found.capacity.tokens_in_flight) == (1100, 52000)
    assert search(lambda r: step(r, 100, 2.0), [1.0]).capacity is None


def test_capacity_is_the_highest_throughput_not_the_highest_rate() -> None:
    # throughput can dip at a higher rate that still passes (fewer tokens in the window)
    steps = [step(1.0, 300, 0.2), step(2.0, 700, 0.3), step(3.0, 650, 0.5), step(4.0, 900, 0.5, slow=0.2)]
    best = capacity_of(steps)
    assert best is not None and best.rate_per_s == 2.0


def stream(sent: float, first: float, n: int, gap: float) -> StreamSample:
    return StreamSample(sent, tuple(first + k * gap for k in range(n)))


def test_summarise_converts_wall_time_to_model_time_and_counts_per_replica() -> None:
    # 2x real time: 0.1 wall s to the first token = 0.2 model s; 1/80 wall s gaps = 40 tokens/s
    streams = [stream(float(k), k + 0.1, 41, 1 / 80) for k in range(10)]
    pool = [PoolSample(float(t), 4000, 2, 2) for t in range(12)]
    s = summarise(1.0, streams, pool, (2.0, 10.0), 2.0, Targets())
    assert s.passed and s.requests == 10 and s.errors == 0
    assert s.ttft_p95_s == pytest.approx(0.2) and s.stream_tokens_per_s_p50 == pytest.approx(40.0)
    # window 2..10 wall s holds streams 2..9 whole (41 tokens) and stream 1's none: 8 x 41 tokens
    # over 16 model s, over 2 replicas
    assert s.output_tokens_per_s == pytest.approx(8 * 41 / 16 / 2)
    assert (s.tokens_in_flight, s.streams) == (2000, 1)


def test_a_step_fails_on_ttft_slow_streams_or_errors_and_says_why() -> None:
    slow = [stream(0.0, 0.1, 20, 1 / 20) for _ in range(9)] + [stream(0.0, 2.0, 20, 1 / 80)]
    s = summarise(1.0, slow, [], (0.0, 5.0), 1.0, Targets())
    assert not s.passed
    assert s.why == ("p95 TTFT 2.00 s >= 1 s", "90% of streams under 30 tokens/s")
    failed = [stream(0.0, 0.1, 20, 1 / 80), StreamSample(0.0, (), "HTTP 503")]
    f = summarise(1.0, failed, [], (0.0, 5.0), 1.0, Targets())
    assert not f.passed and f.errors == 1 and f.why[0].startswith("1 of 2 requests failed (1 HTTP 503): the key's limits")
    assert summarise(1.0, [], [], (0.0, 5.0), 1.0, Targets()).why[-1] == "no request sent"
