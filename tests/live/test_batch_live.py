"""The batch service against `modelfleet up` and the real Envoy: every line goes through the
platform's front door at tier batch with the team's dev key, state in Postgres beside the usage.

One stack for the module (20x real time; reason-70b a tiny pool of 600 tokens in flight where
search holds a 0.9 guaranteed share; the gateway's queue bound 0, so a batch request that does
not fit is shed at once with 503 and Retry-After); the batch API runs as its own process for the
module, and each test starts its own worker process (stopped, or killed, by PID). The stack's own
batch service (behind Envoy on the base URL, with its worker, tables under another prefix) serves
the OpenAI-client test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from batch.service import batch_service_argv
from batch.store import BatchStore
from gateway_ext.metering.store import UsageStore
from modelfleet.contract.headers import PRIORITY_HEADER
from modelfleet.contract.metrics import BATCH_THROTTLED, GATEWAY_POOL_ADMITTED, GATEWAY_TEAM_SHED
from modelfleet.contract.tokens import chat_prompt_ids
from modelfleet.local.harness import RunningStack, edit_yaml, postgres_stack, write_config
from modelfleet.local.processes import free_port
from replica.generation import plan_output

pytestmark = pytest.mark.live

REASON_TOKENS_IN_FLIGHT = 600
"""reason-70b's pool here: batch fits only below 90% of it (540 tokens)."""
ESSAY = "Write a long essay."
LOAD_TOKENS = 535
"""An interactive request of search reserving this many tokens (prompt + max_tokens) fits its
0.9 share (540) and leaves no room for any batch request (batch ceiling 540)."""
FINAL = ("completed", "failed", "expired", "cancelled")


def _small_pool(config: Path) -> None:
    def teams(data: Any) -> None:
        for team in data["teams"]:
            for lim in team["limits"]:
                if lim["model"] == "reason-70b":
                    lim["guaranteed_share"] = 0.9 if team["name"] == "search" else 0.1
                    if team["name"] == "search":
                        lim["tiers"] = ["interactive", "standard"]

    def models(data: Any) -> None:
        reason = next(v for v in data["versions"] if v["model"] == "reason-70b")
        reason["capacity"]["tokens_in_flight"] = REASON_TOKENS_IN_FLIGHT

    edit_yaml(config / "teams.yaml", teams)
    edit_yaml(config / "models.yaml", models)


@pytest.fixture(scope="module")
def prefix() -> str:
    return f"live_batch_{uuid.uuid4().hex[:8]}_"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, postgres_url: str,
          prefix: str) -> Iterator[RunningStack]:
    cwd = tmp_path_factory.mktemp("batch")
    config = write_config(cwd / "config", time_scale=20.0, replicas={
        "chat-7b@v13": 1, "chat-7b@v14": 1, "reason-70b@v1": 1})
    _small_pool(config)
    env = {"MODELFLEET_GATEWAY_MAX_QUEUE": "0", "MODELFLEET_BATCH_TABLE_PREFIX": prefix + "s_",
           "MODELFLEET_BATCH_POLL_INTERVAL_S": "0.2"}
    (cwd / "data").mkdir()
    with postgres_stack(cwd, config, postgres_url, prefix, env=env) as running:
        yield running


@dataclass
class Service:
    """A batch service process (API or worker)."""

    popen: subprocess.Popen[bytes]
    url: str
    log: Path

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, sig)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait()


def _start(fleet: RunningStack, db_url: str, prefix: str, role: str, name: str,
           *extra: str) -> Service:
    port = free_port()
    argv = batch_service_argv(Path(fleet.facts["config_dir"]), "127.0.0.1", port, db_url,
                              fleet.base_url, table_prefix=prefix, role=role,
                              file_roots=[fleet.cwd / "data"], extra=list(extra))
    log = fleet.cwd / f"{name}.log"
    with log.open("ab") as fh:
        popen = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, cwd=fleet.cwd, start_new_session=True)
    service = Service(popen, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(service.url + "/health", timeout=1).status_code == 200:
                return service
        except httpx.HTTPError:
            pass
        if popen.poll() is not None or time.monotonic() > deadline:
            service.stop()
            raise RuntimeError(f"batch {role} did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def api(fleet: RunningStack, postgres_url: str, prefix: str) -> Iterator[str]:
    """The batch API's base URL (its own process, role api)."""
    service = _start(fleet, postgres_url, prefix, "api", "batch-api")
    try:
        yield service.url
    finally:
        service.stop()
        store = BatchStore(postgres_url, prefix)
        store.drop_tables()
        store.dispose()


@pytest.fixture
def worker(fleet: RunningStack, postgres_url: str,
           prefix: str) -> Iterator[Callable[..., Service]]:
    """Start batch workers (role worker, dev keys, lease 2 s); each is stopped by PID after."""
    started: list[Service] = []

    def start(name: str = "w1", *flags: str) -> Service:
        service = _start(fleet, postgres_url, prefix, "worker", f"worker-{name}",
                         "--worker-id", name, "--lease", "2", "--poll-interval", "0.2", *flags)
        started.append(service)
        return service
    yield start
    for service in started:
        service.stop()


def key(fleet: RunningStack, team: str) -> dict[str, str]:
    return {"authorization": f"Bearer {fleet.key(team)}"}


def write_input(fleet: RunningStack, name: str, lines: list[Any]) -> Path:
    path = fleet.cwd / "data" / f"{name}.jsonl"
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def line(cid: str, question: str, max_tokens: int, model: str = "chat-7b",
         **body: Any) -> dict[str, Any]:
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "max_tokens": max_tokens, "temperature": 0,
                     "messages": [{"role": "user", "content": question}], **body}}


def create(api: str, fleet: RunningStack, team: str, model: str, path: Path,
           **extra: Any) -> dict[str, Any]:
    r = httpx.post(api + "/v1/batches", headers=key(fleet, team), timeout=10,
                   json={"model": model, "input_uri": path.as_uri(), **extra})
    assert r.status_code == 200, r.text
    made: dict[str, Any] = r.json()
    return made


def get(api: str, fleet: RunningStack, team: str, batch_id: str) -> httpx.Response:
    return httpx.get(f"{api}/v1/batches/{batch_id}", headers=key(fleet, team), timeout=10)


def wait(api: str, fleet: RunningStack, team: str, batch_id: str,
         until: Callable[[dict[str, Any]], bool], timeout_s: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        batch: dict[str, Any] = get(api, fleet, team, batch_id).json()
        if until(batch):
            return batch
        assert time.monotonic() < deadline, batch
        time.sleep(0.05)


def output(batch: dict[str, Any]) -> list[dict[str, Any]]:
    text = Path(batch["output_uri"].removeprefix("file://")).read_text()
    return [json.loads(x) for x in text.splitlines()]


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 when none)."""
    text = httpx.get(url + "/metrics", timeout=5).text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == name and labels.items() <= s.labels.items())


def test_a_200_line_batch_completes_through_the_stack_metered_at_tier_batch(
        fleet: RunningStack, api: str, worker: Callable[..., Service], postgres_url: str,
        prefix: str) -> None:
    questions = [(f"q{i}", f"Question {i} about token buckets", 2 + i % 4) for i in range(200)]
    path = write_input(fleet, "two-hundred", [line(c, q, k) for c, q, k in questions])
    admitted = GATEWAY_POOL_ADMITTED
    before = metric(fleet.gateway_url, admitted, tier="batch")
    usage = UsageStore(postgres_url, prefix)

    def support_requests() -> int:
        return sum(r.counts.requests for r in usage.rows(team="support", model="chat-7b"))
    requests_before = support_requests()
    worker("w-200", "--concurrency", "16")
    made = create(api, fleet, "support", "chat-7b", path, completion_window="1h")
    batch = wait(api, fleet, "support", made["id"], lambda b: b["status"] in FINAL)
    assert batch["status"] == "completed", batch
    assert batch["counts"] == {"total": 200, "completed": 200, "failed": 0, "pending": 0,
                               "incomplete": 0}
    assert batch["in_progress_at"] and batch["completed_at"] and batch["output_written_at"]
    out = output(batch)
    assert [o["custom_id"] for o in out] == [c for c, _, _ in questions]
    for o, (_, question, k) in zip(out, questions, strict=True):
        plan = plan_output(chat_prompt_ids([("user", question)]), max_tokens=k, seed=0,
                           temperature=0)
        body = o["response"]["body"]
        assert o["response"]["status_code"] == 200 and o["error"] is None
        assert body["choices"][0]["message"]["content"] == plan.text
        assert body["usage"]["completion_tokens"] == plan.num_tokens
        assert o["response"]["request_id"] == body["id"]
    hidden = get(api, fleet, "research", made["id"])  # another team: as if it did not exist
    assert hidden.status_code == 404 and hidden.json()["error"]["code"] == "batch_not_found"
    # metered like any request: admitted at tier batch, and 200 more usage rows' requests
    assert metric(fleet.gateway_url, admitted, tier="batch") - before == 200
    deadline = time.monotonic() + 10
    while support_requests() - requests_before < 200:
        assert time.monotonic() < deadline, support_requests() - requests_before
        time.sleep(0.1)
    assert support_requests() - requests_before == 200
    usage.dispose()


def test_malformed_lines_are_reported_per_line_without_failing_the_batch(
        fleet: RunningStack, api: str, worker: Callable[..., Service]) -> None:
    path = write_input(fleet, "malformed", [
        line("a", "First question", 3), "{not json", {"method": "POST", "body": {}},
        line("a", "Same id again", 3), line("m", "Other model", 3, model="reason-70b"),
        line("z", "Zero tokens", 0), line("s", "Streamed", 3, stream=True),
        line("b", "Last question", 3)])
    worker("w-bad")
    made = create(api, fleet, "research", "chat-7b", path)
    batch = wait(api, fleet, "research", made["id"], lambda b: b["status"] in FINAL)
    assert batch["status"] == "completed" and batch["errors"] is None
    assert batch["request_counts"] == {"total": 8, "completed": 2, "failed": 6}
    out = output(batch)
    assert [o["custom_id"] for o in out] == ["a", None, None, "a", "m", "z", "s", "b"]
    codes = [(o["error"] or {}).get("code") for o in out]
    assert codes == [None, "invalid_json", "invalid_custom_id", "duplicate_custom_id",
                     "model_mismatch", None, "stream_unsupported", None]
    assert [o["error"]["line"] for o in out if o["error"]] == [2, 3, 4, 5, 7]
    zero = out[5]["response"]  # the gateway's own 400, kept as the line's answer
    assert zero["status_code"] == 400 and zero["body"]["error"]["param"] == "max_tokens"
    for cancel_or_get in (get(api, fleet, "support", made["id"]),
                          httpx.post(f"{api}/v1/batches/{made['id']}/cancel",
                                     headers=key(fleet, "support"))):
        assert cancel_or_get.status_code == 404


def _interactive_load(fleet: RunningStack, seconds: float, statuses: Counter[int]) -> None:
    """search's interactive streams back to back for ``seconds``, each reserving LOAD_TOKENS."""
    max_tokens = LOAD_TOKENS - len(chat_prompt_ids([("user", ESSAY)]))
    body = {"model": "reason-70b", "stream": True, "max_tokens": max_tokens, "ignore_eos": True,
            "messages": [{"role": "user", "content": ESSAY}]}
    headers = {**key(fleet, "search"), PRIORITY_HEADER: "interactive"}
    end = time.monotonic() + seconds
    with httpx.Client(timeout=30) as client:
        while time.monotonic() < end:
            with client.stream("POST", fleet.base_url + "/chat/completions", json=body,
                               headers=headers) as r:
                statuses[r.status_code] += 1
                for _ in r.iter_lines():
                    pass
            if r.status_code == 429:  # the last stream's settle is still on its way: its
                time.sleep(0.05)  # tokens count against search's share until it lands


def test_the_batch_pauses_under_interactive_load_then_resumes(
        fleet: RunningStack, api: str, worker: Callable[..., Service]) -> None:
    path = write_input(fleet, "paused", [line(f"p{i}", f"Question {i}", 4, model="reason-70b")
                                         for i in range(80)])
    shed = GATEWAY_TEAM_SHED
    shed_before = metric(fleet.gateway_url, shed, team="research", tier="batch")
    w = worker("w-pause", "--concurrency", "4", "--urgent-window", "0")
    made = create(api, fleet, "research", "reason-70b", path, completion_window="1h")
    wait(api, fleet, "research", made["id"], lambda b: b["counts"]["completed"] >= 5)
    statuses: Counter[int] = Counter()
    load = threading.Thread(target=_interactive_load, args=(fleet, 3.0, statuses))
    load.start()
    try:
        paused = wait(api, fleet, "research", made["id"],
                      lambda b: b["throttled"] > 0 and b["paused_until"] is not None, 3.0)
        while load.is_alive():  # the pause (Retry-After >= 5 s) outlasts the load (3 s)
            now = get(api, fleet, "research", made["id"]).json()
            assert now["counts"]["completed"] <= paused["counts"]["completed"] + 4  # in flight
            time.sleep(0.1)
    finally:
        load.join()
    assert statuses[503] == 0 and statuses[200] >= 2  # interactive is never shed
    assert paused["counts"]["pending"] > 0 and paused["tier"] == "batch"
    batch = wait(api, fleet, "research", made["id"], lambda b: b["status"] in FINAL, 20)
    assert batch["status"] == "completed" and batch["counts"]["completed"] == 80
    assert metric(fleet.gateway_url, shed, team="research", tier="batch") > shed_before
    assert metric(w.url, BATCH_THROTTLED, status="503") >= 1


def test_a_killed_worker_is_restarted_and_every_line_has_exactly_one_result(
        fleet: RunningStack, api: str, worker: Callable[..., Service]) -> None:
    lines = [line(f"k{i}", f"Kill question {i}", 30, ignore_eos=True) for i in range(120)]
    path = write_input(fleet, "killed", lines)
    admitted = GATEWAY_POOL_ADMITTED
    before = metric(fleet.gateway_url, admitted, tier="batch")
    first = worker("w-kill-1", "--concurrency", "2")
    made = create(api, fleet, "research", "chat-7b", path)
    mid = wait(api, fleet, "research", made["id"], lambda b: b["counts"]["completed"] >= 30)
    first.stop(signal.SIGKILL)  # no goodbye: the lease stays until it runs out (2 s)
    assert first.popen.returncode == -signal.SIGKILL
    assert mid["status"] == "in_progress" and mid["counts"]["pending"] > 0
    worker("w-kill-2", "--concurrency", "2")
    batch = wait(api, fleet, "research", made["id"], lambda b: b["status"] in FINAL)
    assert batch["status"] == "completed" and batch["counts"]["completed"] == 120
    out = output(batch)
    assert [o["custom_id"] for o in out] == [f"k{i}" for i in range(120)]  # one each, in order
    assert all(o["response"]["status_code"] == 200 for o in out)
    resent = metric(fleet.gateway_url, admitted, tier="batch") - before - 120
    assert 0 <= resent <= 2  # only what was in flight at the kill ran twice


def test_a_passed_deadline_expires_the_batch_and_keeps_partial_results(
        fleet: RunningStack, api: str, worker: Callable[..., Service]) -> None:
    path = write_input(fleet, "expired", [line(f"e{i}", f"Slow question {i}", 150,
                                               model="reason-70b", ignore_eos=True)
                                          for i in range(40)])
    worker("w-late", "--concurrency", "1")  # urgency window: the default hour
    made = create(api, fleet, "research", "reason-70b", path, deadline=time.time() + 3)
    batch = wait(api, fleet, "research", made["id"], lambda b: b["status"] in FINAL)
    assert batch["status"] == "expired" and batch["expired_at"] >= made["deadline"]
    assert batch["deadline_risk"] == "at_risk"
    assert batch["tier"] == "standard"  # research may send standard to reason-70b
    counts = batch["counts"]
    assert counts["completed"] >= 1 and counts["incomplete"] >= 1 and counts["pending"] == 0
    out = output(batch)
    assert [o["custom_id"] for o in out] == [f"e{i}" for i in range(40)]
    done = [o for o in out if o["response"] is not None]
    assert len(done) == counts["completed"]
    assert all(o["response"]["body"]["usage"]["completion_tokens"] == 150 for o in done)
    assert {o["error"]["code"] for o in out if o["response"] is None} == {"batch_expired"}


def test_the_openai_client_runs_a_batch_through_modelfleet_up(
        fleet: RunningStack, postgres_url: str, prefix: str) -> None:
    """Upload, create, poll, read the output with OpenAI's client on the stack's base URL (the
    stack's own batch service and worker, behind Envoy); another team sees nothing; the lines
    are metered at tier batch."""
    assert {p["role"] for p in fleet.facts["processes"]} >= {"batch", "gateway", "envoy"}
    assert fleet.facts["batch"]["url"].startswith("http://127.0.0.1:")
    usage = UsageStore(postgres_url, prefix)

    def batch_requests() -> int:
        return sum(r.counts.requests for r in usage.rows(team="research", model="chat-7b",
                                                         tier="batch"))
    before = batch_requests()
    n = 12
    data = "".join(json.dumps(line(f"o{i}", f"OpenAI client question {i}", 3)) + "\n"
                   for i in range(n)).encode()
    client = openai.OpenAI(base_url=fleet.base_url, api_key=fleet.key("research"), max_retries=0)
    other = openai.OpenAI(base_url=fleet.base_url, api_key=fleet.key("support"), max_retries=0)
    uploaded = client.files.create(file=("questions.jsonl", data), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    deadline = time.monotonic() + 40
    while batch.status not in FINAL:
        assert time.monotonic() < deadline, batch
        time.sleep(0.1)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed", batch
    assert batch.output_file_id is not None
    out = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
    assert [o["custom_id"] for o in out] == [f"o{i}" for i in range(n)]  # one result per line
    assert all(o["response"]["status_code"] == 200 for o in out)
    for call in (lambda: other.batches.retrieve(batch.id),
                 lambda: other.files.content(uploaded.id),
                 lambda: other.files.content(str(batch.output_file_id))):
        with pytest.raises(openai.NotFoundError):
            call()
    deadline = time.monotonic() + 10
    while batch_requests() - before < n:  # the gateway flushes usage every 0.5 s here
        assert time.monotonic() < deadline, batch_requests() - before
        time.sleep(0.1)
    assert batch_requests() - before == n
    usage.dispose()
    # input_uri still works, confined to the team's own folder of the stack
    folders = Path(fleet.facts["batch"]["file_root"]).parent
    (folders / "support" / "theirs.jsonl").write_bytes(data)
    (folders / "research" / "mine.jsonl").write_bytes(data)
    for name, status in (("support/theirs.jsonl", 400), ("research/mine.jsonl", 200)):
        r = httpx.post(fleet.base_url + "/batches", headers=key(fleet, "research"), timeout=10,
                       json={"model": "chat-7b", "input_uri": (folders / name).as_uri()})
        assert r.status_code == status, r.text
    assert httpx.post(f"{fleet.base_url}/batches/{r.json()['id']}/cancel",
                      headers=key(fleet, "research"), timeout=10).status_code in (200, 409)
    client.close()
    other.close()
