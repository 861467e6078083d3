"""Batch files by URI: ``file://`` written atomically under the allowed roots only, and
``s3://`` against a real S3-compatible server (moto's server mode, started here)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import boto3  # type: ignore[import-untyped]
import httpx
import pytest

from batch.files import BatchFileError, BatchFiles, Location, parse_uri
from modelfleet.local.processes import free_port


def test_uris_parse_to_locations() -> None:
    assert parse_uri("file:///data/in%20put.jsonl") == Location("file", path=Path("/data/in put.jsonl"))
    assert parse_uri("s3://bucket/dir/in.jsonl") == Location("s3", bucket="bucket", key="dir/in.jsonl")
    for bad in ("in.jsonl", "file://host/x", "file:relative", "s3://bucket", "s3:///key",
                "https://example.com/x"):
        with pytest.raises(BatchFileError) as exc:
            parse_uri(bad)
        assert exc.value.code == "invalid_uri"


def test_local_files_stay_under_the_roots(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.jsonl").write_text("secret\n")
    (root / "link").symlink_to(outside)
    files = BatchFiles([root])
    for uri in ((outside / "secret.jsonl").as_uri(), (root / "link" / "secret.jsonl").as_uri(),
                f"file://{root}/../outside/secret.jsonl"):
        with pytest.raises(BatchFileError) as exc:
            files.read(uri)
        assert exc.value.code == "uri_not_allowed"
    with pytest.raises(BatchFileError) as missing:
        files.read((root / "nope.jsonl").as_uri())
    assert missing.value.code == "input_not_found"
    (root / "big.jsonl").write_bytes(b"x" * 100)
    with pytest.raises(BatchFileError) as big:
        files.read((root / "big.jsonl").as_uri(), max_bytes=99)
    assert big.value.code == "input_too_large"


def test_local_output_replaces_the_file_atomically(tmp_path: Path) -> None:
    files = BatchFiles([tmp_path])
    target = tmp_path / "sub" / "out.jsonl"
    files.write_lines(target.as_uri(), ['{"a": 1}', '{"b": 2}'])
    assert target.read_text() == '{"a": 1}\n{"b": 2}\n'
    inode = target.stat().st_ino
    files.write_lines(target.as_uri(), ['{"c": 3}'])
    assert target.read_text() == '{"c": 3}\n'
    assert target.stat().st_ino != inode  # a new file renamed over the old one, not rewritten
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.jsonl"]  # no temp left
    (tmp_path / "ro").mkdir(mode=0o500)
    if os.geteuid() != 0:  # root writes anywhere
        with pytest.raises(BatchFileError) as denied:
            files.write_lines((tmp_path / "ro" / "out.jsonl").as_uri(), ["{}"])
        assert denied.value.code == "output_unwritable"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server on a free loopback port, stopped by its PID afterwards."""
    exe = shutil.which("moto_server")
    if exe is None:
        if os.environ.get("CI") == "true":
            pytest.fail("moto_server is not installed")
        pytest.skip("moto_server is not installed")
    port = free_port()
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(url, timeout=0.5)
                break
            except httpx.HTTPError:
                assert proc.poll() is None and time.monotonic() < deadline, "moto_server not up"
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


def test_s3_input_and_output(s3_endpoint: str, aws_env: None, tmp_path: Path) -> None:
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    s3.create_bucket(Bucket="batches")
    s3.put_object(Bucket="batches", Key="team/in.jsonl", Body=b'{"custom_id": "a"}\n')
    files = BatchFiles([tmp_path], s3_endpoint_url=s3_endpoint)
    assert files.read("s3://batches/team/in.jsonl") == b'{"custom_id": "a"}\n'
    files.write_lines("s3://batches/team/out.jsonl", ['{"x": 1}', '{"y": 2}'])
    got = s3.get_object(Bucket="batches", Key="team/out.jsonl")
    assert got["Body"].read() == b'{"x": 1}\n{"y": 2}\n'
    assert got["ContentType"] == "application/jsonl"
    with pytest.raises(BatchFileError) as missing:
        files.read("s3://batches/team/none.jsonl")
    assert missing.value.code == "input_not_found"
    with pytest.raises(BatchFileError) as big:
        files.read("s3://batches/team/in.jsonl", max_bytes=3)
    assert big.value.code == "input_too_large"
    fenced = BatchFiles([tmp_path], s3_buckets=["other"], s3_endpoint_url=s3_endpoint)
    with pytest.raises(BatchFileError) as fence:
        fenced.read("s3://batches/team/in.jsonl")
    assert fence.value.code == "uri_not_allowed"
