"""A real Postgres outage: this test starts its OWN Postgres cluster (initdb + pg_ctl on a free
port in a temporary directory, as user ``postgres`` when run as root), meters usage into it,
stops it with ``pg_ctl stop -m fast`` while metering goes on (rows go to the spool), starts it
again and checks that every row arrived exactly once. The machine's Postgres on 5432 is never
touched."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway_ext.metering.meter import UsageMeter, merge_rows
from gateway_ext.metering.spool import UsageFlusher, UsageSpool
from gateway_ext.metering.store import UsageStore
from modelfleet.local.processes import free_port

T0 = 1_700_000_040.0


@dataclass
class PrivateCluster:
    """A Postgres cluster of this test: ``data`` directory, TCP ``port``."""

    bin_dir: Path
    data: Path
    port: int
    as_postgres: list[str]

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def pg_ctl(self, *args: str) -> None:
        subprocess.run([*self.as_postgres, str(self.bin_dir / "pg_ctl"), "-D", str(self.data),
                        *args], check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        sock = self.data.parent
        self.pg_ctl("-w", "-l", str(sock / "postgres.log"), "-o",
                    f"-p {self.port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off",
                    "start")

    def stop(self) -> None:
        self.pg_ctl("-w", "-m", "fast", "stop")


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


@pytest.fixture
def cluster() -> Iterator[PrivateCluster]:
    bin_dir = _bin_dir()
    if bin_dir is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no Postgres server binaries under /usr/lib/postgresql/*/bin")
        pytest.skip("no Postgres server binaries under /usr/lib/postgresql/*/bin")
    root = Path(tempfile.mkdtemp(prefix="mf-pg-"))
    as_postgres: list[str] = []
    if os.geteuid() == 0:  # postgres refuses to run as root
        shutil.chown(root, "postgres", "postgres")
        as_postgres = ["runuser", "-u", "postgres", "--"]
    made = PrivateCluster(bin_dir, root / "data", free_port(), as_postgres)
    subprocess.run([*as_postgres, str(bin_dir / "initdb"), "-D", str(made.data), "-A", "trust",
                    "-U", "postgres", "--no-sync"], check=True, capture_output=True, timeout=120)
    made.start()
    try:
        yield made
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):  # already stopped
            made.stop()
        shutil.rmtree(root, ignore_errors=True)


def record(meter: UsageMeter, twin: UsageMeter, step: int) -> None:
    """Some usage at minute ``step`` (both meters get the same)."""
    for m in (meter, twin):
        now = T0 + 60 * step
        m.record_usage("search", "chat-7b", "v13", now, 100 + step, 10, 20, tier="interactive")
        m.record_usage("search", "chat-7b", "v13", now + 1, 7, 0, 3, tier="batch")
        m.record_rejected("support", "chat-7b", now + 2, tier="standard")


def test_postgres_stopped_mid_run_and_restarted_loses_no_row(cluster: PrivateCluster,
                                                              tmp_path: Path) -> None:
    store = UsageStore(cluster.url, "outage_", connect_timeout_s=1)
    store.create_tables()
    meter, twin = UsageMeter("us-east-1"), UsageMeter("us-east-1")
    flusher = UsageFlusher(meter, store, UsageSpool(tmp_path / "spool.jsonl"))
    record(meter, twin, 0)
    assert flusher.flush(T0).written == 1

    cluster.stop()
    for step in (1, 2, 3):  # metering goes on; every flush finds the database gone
        record(meter, twin, step)
        result = flusher.flush(T0 + 60 * step)
        assert (result.written, result.pending) == (0, step)
    assert len(flusher.spool.batches()) == 3

    cluster.start()
    record(meter, twin, 4)
    result = flusher.flush(T0 + 300)
    assert (result.written, result.skipped, result.pending) == (4, 0, 0)
    assert flusher.spool.batches() == []
    assert flusher.flush(T0 + 301).written == 0  # nothing left, nothing written twice
    expected = merge_rows(twin.drain())
    assert store.rows() == expected
    assert len(store.batch_ids()) == 5
    assert {r.key.tier for r in store.rows()} == {"interactive", "batch", "standard"}
    store.dispose()
