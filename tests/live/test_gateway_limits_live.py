"""Limits through `modelfleet up` and the real Envoy, on a config with a small team limit and a
tiny pool: 429 with a computed Retry-After while another team is unaffected, 503 shed with
Retry-After, the seed's isolation test at small scale, and usage rows in Postgres that match
what the clients saw."""

from __future__ import annotations

import json
import math
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam

from gateway_ext.metering.store import UsageStore
from modelfleet.contract.headers import CONVERSATION_HEADER, PRIORITY_HEADER
from modelfleet.contract.tokens import chat_prompt_ids
from modelfleet.local.harness import RunningStack, edit_yaml, postgres_stack, write_config

pytestmark = pytest.mark.live

NOISY_TOKENS_PER_MINUTE = 1200
"""research's limit on chat-7b here: 20 tokens per second."""
REASON_TOKENS_IN_FLIGHT = 300
"""reason-70b's load-tested tokens in flight per replica here: a tiny pool."""
ESSAY = "Write a long essay."


def _small_limits(config: Path) -> None:
    def teams(data: Any) -> None:
        research = next(t for t in data["teams"] if t["name"] == "research")
        chat = next(lim for lim in research["limits"] if lim["model"] == "chat-7b")
        chat["tokens_per_minute"] = NOISY_TOKENS_PER_MINUTE

    def models(data: Any) -> None:
        reason = next(v for v in data["versions"] if v["model"] == "reason-70b")
        reason["capacity"]["tokens_in_flight"] = REASON_TOKENS_IN_FLIGHT

    edit_yaml(config / "teams.yaml", teams)
    edit_yaml(config / "models.yaml", models)


@pytest.fixture(scope="module")
def table_prefix() -> str:
    return f"live_{uuid.uuid4().hex[:10]}_"


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory, postgres_url: str,
            table_prefix: str) -> Iterator[RunningStack]:
    """A stack with research limited to 1,200 tokens per minute on chat-7b, a 300-token
    reason-70b pool, a one-entry queue, usage in Postgres flushed every 0.5 s; 20x real time."""
    cwd = tmp_path_factory.mktemp("limited")
    config = write_config(cwd / "config", time_scale=20.0, replicas={
        "chat-7b@v13": 2, "chat-7b@v14": 1, "reason-70b@v1": 1})
    _small_limits(config)
    with postgres_stack(cwd, config, postgres_url, table_prefix,
                        env={"MODELFLEET_GATEWAY_MAX_QUEUE": "1"}) as running:
        yield running


def api(stack: RunningStack, team: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url, api_key=stack.key(team), max_retries=0,
                         timeout=60.0)


class Held:
    """A long streamed answer being received; ``close`` leaves it mid-stream."""

    def __init__(self, client: httpx.Client, response: httpx.Response) -> None:
        self.client, self.response = client, response
        self.lines = response.iter_lines()  # kept: dropping the iterator closes the stream
        next(line for line in self.lines if line.startswith("data: "))

    def close(self) -> None:
        self.response.close()
        self.client.close()


def hold_stream(stack: RunningStack, team: str, model: str, max_tokens: int,
                tier: str = "standard") -> Held:
    """Start a long streamed answer and read its first token."""
    client = httpx.Client(timeout=60)
    body = {"model": model, "stream": True, "max_tokens": max_tokens, "ignore_eos": True,
            "messages": [{"role": "user", "content": ESSAY}]}
    request = client.build_request(
        "POST", stack.base_url + "/chat/completions", json=body,
        headers={"authorization": f"Bearer {stack.key(team)}", PRIORITY_HEADER: tier})
    response = client.send(request, stream=True)
    assert response.status_code == 200, response.read()
    return Held(client, response)


def test_a_team_over_its_limit_gets_429_with_the_computed_wait(limited: RunningStack) -> None:
    question = "What is the capital of France?"
    prompt = len(chat_prompt_ids([("user", question)]))
    held = hold_stream(limited, "research", "chat-7b@v13", 1100)
    try:
        with pytest.raises(openai.RateLimitError) as refused:
            api(limited, "research").chat.completions.create(
                model="chat-7b", max_tokens=1100,
                messages=[{"role": "user", "content": question}])
        headers = refused.value.response.headers
        assert refused.value.response.json()["error"]["code"] == "rate_limit_exceeded"
        assert headers["x-ratelimit-limit-tokens"] == str(NOISY_TOKENS_PER_MINUTE)
        remaining = int(headers["x-ratelimit-remaining-tokens"])
        exact_s = (prompt + 1100 - remaining) * 60 / NOISY_TOKENS_PER_MINUTE  # ~50 s
        wait_s = int(headers["retry-after-ms"]) / 1000
        assert exact_s - 0.1 <= wait_s <= exact_s * 1.5 + 0.1  # the exact wait, plus jitter
        assert int(headers["retry-after"]) == math.ceil(wait_s)
        other = api(limited, "support").chat.completions.create(
            model="chat-7b", max_tokens=5, messages=[{"role": "user", "content": question}])
        assert other.usage is not None and other.usage.completion_tokens == 5  # unaffected
    finally:
        held.close()


def test_a_shed_batch_request_gets_503_with_retry_after(limited: RunningStack) -> None:
    held = hold_stream(limited, "research", "reason-70b", 2000, tier="batch")
    research = api(limited, "research")
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]

    def batch() -> ChatCompletion:
        return research.chat.completions.create(model="reason-70b", max_tokens=5,
                                                messages=messages,
                                                extra_headers={PRIORITY_HEADER: "batch"})

    with ThreadPoolExecutor(1) as pool:
        queued = pool.submit(batch)
        depth = f"{limited.gateway_url}/v1/debug/pools"
        deadline = time.monotonic() + 10
        while httpx.get(depth).json()["reason-70b@v1"]["queued"]["batch"] < 1:
            assert time.monotonic() < deadline and not queued.done()
            time.sleep(0.02)
        with pytest.raises(openai.InternalServerError) as shed:
            batch()
        assert shed.value.status_code == 503
        error = shed.value.response.json()["error"]
        assert (error["type"], error["code"]) == ("server_error", "pool_overloaded")
        assert shed.value.response.headers["content-type"] == "application/json"
        assert 5 <= int(shed.value.response.headers["retry-after"]) <= 8
        held.close()  # the running request ends: the queued one runs
        reply = queued.result(timeout=30)
    assert reply.usage is not None and reply.usage.completion_tokens == 5


def test_a_queued_client_that_leaves_is_taken_out_of_the_queue(limited: RunningStack) -> None:
    held = hold_stream(limited, "research", "reason-70b", 2000, tier="batch")
    pools = f"{limited.gateway_url}/v1/debug/pools"
    try:
        body = {"model": "reason-70b", "max_tokens": 5,
                "messages": [{"role": "user", "content": "hi"}]}
        headers = {"authorization": f"Bearer {limited.key('research')}", PRIORITY_HEADER: "batch"}
        with pytest.raises(httpx.ReadTimeout):  # queued behind the running request; we give up
            httpx.post(limited.base_url + "/chat/completions", json=body, headers=headers,
                       timeout=httpx.Timeout(10, read=0.5))
        deadline = time.monotonic() + 5  # Envoy cancels its check: the gateway drops the entry
        while httpx.get(pools).json()["reason-70b@v1"]["queued"]["batch"] != 0:
            assert time.monotonic() < deadline, "the abandoned request is still queued"
            time.sleep(0.02)
        assert httpx.get(f"{limited.gateway_url}/health").json()["queued"] == 0
    finally:
        held.close()


def _ttfts(stack: RunningStack, team: str, count: int, out: list[float],
           statuses: Counter[int]) -> None:
    """``count`` streamed requests one after another; time to the first token (seconds)."""
    headers = {"authorization": f"Bearer {stack.key(team)}"}
    with httpx.Client(timeout=30) as client:
        for i in range(count):
            body = {"model": "chat-7b", "stream": True, "max_tokens": 8,
                    "messages": [{"role": "user", "content": f"{team} question {i}"}]}
            start = time.perf_counter()
            with client.stream("POST", stack.base_url + "/chat/completions", json=body,
                               headers={**headers, CONVERSATION_HEADER: f"{team}-{i}"}) as r:
                statuses[r.status_code] += 1
                lines = r.iter_lines()
                if any(line.startswith("data: ") for line in lines):
                    out.append(time.perf_counter() - start)
                for _ in lines:  # read the rest: the answer runs to its end
                    pass


def _phase(stack: RunningStack, count: int) -> tuple[list[float], Counter[int]]:
    ttfts: list[float] = []
    statuses: Counter[int] = Counter()
    workers = [threading.Thread(target=_ttfts, args=(stack, team, count, ttfts, statuses))
               for team in ("search", "support")]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return ttfts, statuses


def _p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1]


def test_isolation_one_team_at_ten_times_its_limit(limited: RunningStack) -> None:
    """The seed's isolation test, small: research sends 10x its tokens per minute; only it sees
    429s and the other teams' p95 TTFT stays within noise of a baseline phase."""
    base, base_statuses = _phase(limited, 40)
    cost = len(chat_prompt_ids([("user", "noise")])) + 20
    rate = 10 * NOISY_TOKENS_PER_MINUTE / 60 / cost  # requests per second for 10x the limit
    noisy: Counter[int] = Counter()
    stop = threading.Event()

    def noise() -> None:
        headers = {"authorization": f"Bearer {limited.key('research')}"}
        body = {"model": "chat-7b", "max_tokens": 20,
                "messages": [{"role": "user", "content": "noise"}]}
        with httpx.Client(timeout=30) as client, ThreadPoolExecutor(4) as pool:
            def one() -> None:
                noisy[client.post(limited.base_url + "/chat/completions", json=body,
                                  headers=headers).status_code] += 1
            next_at = time.monotonic()
            while not stop.is_set():
                pool.submit(one)
                next_at += 1 / rate
                time.sleep(max(0.0, next_at - time.monotonic()))

    # the runaway script's first request takes most of its bucket (a minute of tokens): without it
    # the test would wait ~7 s for 10x the rate to drain a full bucket
    left = httpx.get(f"{limited.gateway_url}/v1/debug/buckets/research/chat-7b").json()
    essay = len(chat_prompt_ids([("user", ESSAY)]))
    held = hold_stream(limited, "research", "chat-7b@v13", left["remaining_tokens"] - essay - 5)
    thread = threading.Thread(target=noise)
    thread.start()
    try:
        time.sleep(0.3)
        loud, loud_statuses = _phase(limited, 40)
    finally:
        stop.set()
        thread.join()
        held.close()
    assert set(base_statuses) == {200} and set(loud_statuses) == {200}  # no 429 for them
    assert noisy[429] > noisy[200] and set(noisy) <= {200, 429}
    p95_base, p95_loud = _p95(base), _p95(loud)
    print(f"isolation: p95 TTFT {p95_base * 1000:.1f} ms alone, {p95_loud * 1000:.1f} ms with "
          f"research at 10x its limit ({dict(noisy)})")
    assert p95_loud <= 3 * p95_base + 0.05  # generous: 2 shared cores, Envoy and gateway busy


def test_usage_rows_in_postgres_match_what_the_client_saw(
        limited: RunningStack, postgres_url: str, table_prefix: str) -> None:
    seen = Counter[str]()
    search = api(limited, "search")
    for i in range(4):
        stream = search.chat.completions.create(
            model="reason-70b", max_tokens=6 + i, stream=True,
            stream_options={"include_usage": True},
            messages=[{"role": "user", "content": f"Count to {i}."}])
        usage = [c.usage for c in stream if c.usage is not None][-1]
        seen["prompt_tokens"] += usage.prompt_tokens
        seen["output_tokens"] += usage.completion_tokens
        details = usage.prompt_tokens_details
        seen["cached_tokens"] += (details.cached_tokens or 0) if details else 0
        seen["requests"] += 1
    store = UsageStore(postgres_url, table_prefix)
    try:
        def totals() -> Counter[str]:
            rows = [r for r in store.rows() if (r.key.team, r.key.model) == ("search",
                                                                            "reason-70b")]
            out = Counter[str]()
            for r in rows:
                for name in ("prompt_tokens", "output_tokens", "cached_tokens", "requests"):
                    out[name] += getattr(r.counts, name)
            return out

        deadline = time.monotonic() + 10
        while totals() != seen:
            assert time.monotonic() < deadline, (totals(), seen)
            time.sleep(0.1)
        rows = store.rows()
        assert {(r.key.version, r.key.region) for r in rows if r.key.model == "reason-70b"
                and r.key.team == "search"} == {("v1", "local")}
        assert sum(r.counts.rejected_429 for r in rows if r.key.team == "research") > 0
        assert sum(r.counts.shed_503 for r in rows if r.key.team == "research") >= 1
    finally:
        store.dispose()
    assert json.loads(json.dumps(dict(seen)))  # plain data, for the failure message above
