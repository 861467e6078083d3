"""xDS convergence: time from a change at the control plane until every Envoy has ACKed it.

Starts the control plane (``python -m envoy_control``) on a generated config of 50
``model@version`` clusters (10 models x 5 versions, a few replicas each) and 5 real Envoys, then
applies changes one after another, cycling through five kinds:

- ``replica-add`` / ``replica-remove``: ``PUT``/``DELETE /v1/replicas/{id}`` (EDS);
- ``canary``: a model's canary percent changes, ``POST /v1/config/reload`` (RDS);
- ``version-add`` / ``version-remove``: a 51st version comes and goes (CDS, EDS, RDS).

Each change is timed until the control plane's ACK records show every Envoy ACKed every type the
change touched (and EDS again after a CDS change), using the ACK timestamps the control plane
records (``GET /v1/xds/status``), twice: from just before the HTTP call (end to end: a config
change includes re-reading and validating the YAML) and from the moment the control plane
published the snapshot (the xDS part alone). Prints p50/p95/p99/max in ms per kind and overall;
the goal is p99 <= 200 ms. Never fails on a time.

    python benchmarks/bench_xds_convergence.py [--changes 50] [--envoys 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from modelfleet.local.envoy_process import EnvoyProcess, free_port, start_envoy, stop_envoy

REPO = Path(__file__).resolve().parents[1]
KINDS = ("replica-add", "shadow", "version-add", "replica-remove", "version-remove")
"""Change kinds. The canary split is the gateway's (router state), not Envoy's, so a canary change
is not an xDS change; a shadow-fraction change is (Envoy mirrors the requests)."""


def generate_config(models: int, versions: int) -> dict[str, Any]:
    """``models`` x ``versions`` declared versions, cloned from the example chat-7b@v13 record."""
    example = yaml.safe_load((REPO / "config" / "models.yaml").read_text())
    template = next(
        v for v in example["versions"] if v["model"] == "chat-7b" and v["version"] == "v13"
    )
    data: dict[str, Any] = {"models": [], "versions": []}
    for m in range(models):
        name = f"bench-m{m}"
        data["models"].append(
            {"name": name, "live": "v1", "canary": {"version": "v2", "percent": 10}}
        )
        for v in range(1, versions + 1):
            status = "live" if v == 1 else "canary" if v == 2 else "registered"
            data["versions"].append(
                {**template, "model": name, "version": f"v{v}", "status": status}
            )
    return data


def write_config(config_dir: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as ``models.yaml`` atomically (the control plane may be polling)."""
    tmp = config_dir.parent / "models.yaml.tmp"
    tmp.write_text(yaml.safe_dump(data, sort_keys=False))
    os.replace(tmp, config_dir / "models.yaml")


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile ``p`` (0..100) of ``values``."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def summary(values: list[float]) -> dict[str, float]:
    """count, p50, p95, p99 and max of latencies in ms."""
    return {
        "count": len(values),
        "p50_ms": percentile(values, 50),
        "p95_ms": percentile(values, 95),
        "p99_ms": percentile(values, 99),
        "max_ms": max(values),
    }


class Bench:
    """The control-plane process, its HTTP client and the Envoys; ``stop`` ends them by PID."""

    def __init__(self, work: Path, data: dict[str, Any]) -> None:
        self.work = work
        self.config_dir = work / "config"
        self.config_dir.mkdir(parents=True)
        self.data = data
        write_config(self.config_dir, data)
        self.xds_port, self.http_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.http_port}"
        self.http = httpx.Client(timeout=10)
        self.envoys: list[EnvoyProcess] = []
        argv = [
            sys.executable,
            "-P",
            "-m",
            "envoy_control",
            "--config",
            str(self.config_dir),
            "--xds-port",
            str(self.xds_port),
            "--http-port",
            str(self.http_port),
            "--listener-port",
            str(free_port()),
            "--watch-interval",
            "3600",
            "--no-access-log",
            "--log-level",
            "warning",
        ]
        with (work / "control-plane.log").open("ab") as log:
            self.cp = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self._wait(lambda: self._healthy(), 30)

    def _healthy(self) -> bool:
        if self.cp.poll() is not None:
            raise RuntimeError((self.work / "control-plane.log").read_text())
        try:
            return self.http.get(self.url + "/health").status_code == 200
        except httpx.HTTPError:
            return False

    @staticmethod
    def _wait(probe: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not probe():
            if time.monotonic() > deadline:
                raise TimeoutError("timed out")
            time.sleep(0.02)

    def status(self) -> dict[str, Any]:
        r = self.http.get(self.url + "/v1/xds/status")
        r.raise_for_status()
        data: dict[str, Any] = r.json()
        return data

    def start_envoys(self, count: int) -> None:
        for i in range(count):
            self.envoys.append(
                start_envoy(
                    node_id=f"bench-envoy-{i}",
                    xds_port=self.xds_port,
                    work_dir=self.work / "envoys",
                    concurrency=1,
                    wait_live_s=30,
                )
            )
        self._wait(lambda: self.status()["converged"] and len(self.status()["nodes"]) == count, 30)

    def put_replica(self, rid: str, model: str, version: str, port: int) -> None:
        self.http.put(
            f"{self.url}/v1/replicas/{rid}",
            json={"model": model, "version": version, "host": "127.0.0.1", "port": port},
        ).raise_for_status()

    def reload(self) -> None:
        write_config(self.config_dir, self.data)
        self.http.post(self.url + "/v1/config/reload").raise_for_status()

    def converged_at(self, started: float, timeout_s: float = 10.0) -> tuple[float, float]:
        """When every Envoy had ACKed what changed after ``started``, and when the control plane
        published that snapshot (both Unix seconds)."""
        deadline = time.monotonic() + timeout_s
        while True:
            st = self.status()
            snapshot = st["snapshot"]
            changed = {t for t, v in snapshot["types"].items() if v == snapshot["version"]}
            if "cds" in changed:
                changed.add("eds")  # clusters re-warm on the EDS sent after them
            latest = 0.0
            done = len(st["nodes"]) == len(self.envoys)
            for node in st["nodes"].values():
                for t in changed:
                    ts = node["types"][t]
                    if (
                        ts["acked_version"] != snapshot["types"][t]
                        or (ts["acked_at"] or 0) < started
                    ):
                        done = False
                    else:
                        latest = max(latest, ts["acked_at"])
            if done:
                return latest, float(snapshot["published_at"])
            if time.monotonic() > deadline:
                acks = {
                    name: {t: (n["types"][t]["acked_version"], round((n["types"][t]["acked_at"] or 0) - started, 3))
                           for t in changed}
                    for name, n in st["nodes"].items()
                }
                raise TimeoutError(
                    f"not converged on {sorted(changed)} at snapshot {snapshot['types']} "
                    f"(published {float(snapshot['published_at']) - started:+.3f} s): {acks}"
                )
            time.sleep(0.002)

    def stop(self) -> None:
        for e in self.envoys:
            stop_envoy(e)
        self.http.close()
        if self.cp.poll() is None:
            os.kill(self.cp.pid, signal.SIGTERM)
            try:
                self.cp.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.cp.pid, signal.SIGKILL)
                self.cp.wait()


def run(opts: argparse.Namespace, say: Callable[[str], None]) -> dict[str, Any]:
    """Set up, apply ``opts.changes`` changes, and return the figures (latencies in ms)."""
    data = generate_config(opts.models, opts.versions)
    with tempfile.TemporaryDirectory(prefix="bench-xds-") as tmp:
        bench = Bench(Path(tmp), data)
        try:
            keys = [(v["model"], v["version"]) for v in data["versions"]]
            for i, (model, version) in enumerate(keys):
                for r in range(opts.replicas):
                    bench.put_replica(f"{model}-{version}-{r}", model, version, 20000 + i * 10 + r)
            say(f"control plane up: {len(keys)} clusters, {len(keys) * opts.replicas} replicas")
            bench.start_envoys(opts.envoys)
            say(f"{opts.envoys} Envoys connected and converged")
            latencies: dict[str, list[float]] = {k: [] for k in KINDS}
            from_publish: dict[str, list[float]] = {k: [] for k in KINDS}
            for n in range(opts.changes):
                kind = KINDS[n % len(KINDS)]
                model = f"bench-m{(n // len(KINDS)) % opts.models}"
                time.sleep(opts.gap_s)
                started = time.time()
                if kind == "replica-add":
                    bench.put_replica(f"extra-{n}", model, "v1", 30000 + n)
                elif kind == "replica-remove":
                    bench.http.delete(f"{bench.url}/v1/replicas/extra-{n - 3}").raise_for_status()
                elif kind == "shadow":
                    m = next(x for x in bench.data["models"] if x["name"] == model)
                    m["shadow"] = {"version": "v3", "fraction": round(0.01 + (n % 40) / 1000, 3)}
                    bench.reload()
                elif kind == "version-add":
                    base = next(v for v in bench.data["versions"] if v["model"] == model)
                    bench.data["versions"].append(
                        {**base, "version": "v99", "status": "registered"}
                    )
                    bench.reload()
                else:
                    bench.data["versions"] = [
                        v for v in bench.data["versions"] if v["version"] != "v99"
                    ]
                    bench.reload()
                acked, published = bench.converged_at(started)
                latencies[kind].append((acked - started) * 1000)
                from_publish[kind].append((acked - published) * 1000)
                if (n + 1) % 10 == 0:
                    say(f"{n + 1}/{opts.changes} changes applied")
        finally:
            bench.stop()
    return {
        "envoys": opts.envoys,
        "clusters": len(keys),
        "replicas_per_cluster": opts.replicas,
        "goal_p99_ms": 200,
        "from_change": table(latencies),
        "from_snapshot_publish": table(from_publish),
    }


def table(latencies: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Summaries per kind of change, then ``overall``."""
    out = {k: summary(v) for k, v in latencies.items() if v}
    out["overall"] = summary([x for xs in latencies.values() for x in xs])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--changes", type=int, default=50, help="changes to apply (default 50)")
    p.add_argument("--envoys", type=int, default=5)
    p.add_argument("--models", type=int, default=10)
    p.add_argument(
        "--versions", type=int, default=5, help="versions per model (clusters = models x versions)"
    )
    p.add_argument("--replicas", type=int, default=3, help="replicas per version")
    p.add_argument("--gap-s", type=float, default=0.05, help="pause between changes, seconds")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    opts = p.parse_args()
    say = (lambda _m: None) if opts.json else (lambda m: print(m, file=sys.stderr, flush=True))
    figures = run(opts, say)
    if opts.json:
        print(json.dumps(figures, indent=2))
        return
    print(
        f"xDS convergence: {figures['envoys']} Envoys, {figures['clusters']} clusters, "
        f"{figures['replicas_per_cluster']} replicas each (goal p99 <= {figures['goal_p99_ms']} ms)"
    )
    for title, key in (
        ("from the API call (config changes include re-reading the YAML)", "from_change"),
        ("from the snapshot publish (xDS push, Envoy apply, ACK)", "from_snapshot_publish"),
    ):
        print(f"\n{title}")
        print(f"{'change':<16}{'count':>6}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'max ms':>9}")
        for name, s in figures[key].items():
            print(
                f"{name:<16}{s['count']:>6}{s['p50_ms']:>9.1f}{s['p95_ms']:>9.1f}{s['p99_ms']:>9.1f}{s['max_ms']:>9.1f}"
            )


if __name__ == "__main__":
    main()
