"""Batch input and output files by URI (I/O edge): ``file://`` (the local default) and ``s3://``.

Output is written atomically: a local file goes to a temporary file in the same directory
(fsynced) that is renamed over the target; an S3 object is one ``PutObject`` of the whole file,
which S3 shows whole or not at all. A reader never sees half an output.

The service reads and writes with its own rights, on behalf of any team, so it confines them:
``file://`` paths must lie under one of ``file_roots`` (symlinks resolved), and ``s3://``
buckets must be in ``s3_buckets`` when that list is given. Errors are :class:`BatchFileError`
values with a short code and a message that never quotes file content.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import boto3  # type: ignore[import-untyped]
from botocore.config import Config  # type: ignore[import-untyped]
from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped]

MAX_INPUT_BYTES = 200 * 1024 * 1024
"""Largest input file, in bytes (OpenAI's batch input limit)."""


class BatchFileError(Exception):
    """A file could not be used; ``code`` is machine-readable."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


@dataclass(frozen=True, slots=True)
class Location:
    """A parsed URI: ``scheme`` file or s3; ``path`` (file) or ``bucket`` and ``key`` (s3)."""

    scheme: str
    path: Path | None = None
    bucket: str = ""
    key: str = ""


def parse_uri(uri: str) -> Location:
    """The location of ``file:///abs/path`` or ``s3://bucket/key``; raises
    :class:`BatchFileError` (``invalid_uri``) otherwise."""
    parsed = urlparse(uri)
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost") and parsed.path:
        path = Path(unquote(parsed.path))
        if path.is_absolute():
            return Location("file", path=path)
    if parsed.scheme == "s3" and parsed.netloc and parsed.path.strip("/"):
        return Location("s3", bucket=parsed.netloc, key=unquote(parsed.path.lstrip("/")))
    raise BatchFileError("invalid_uri", f"Not a file:///absolute/path or s3://bucket/key URI: "
                         f"{uri[:200]!r}.")


class BatchFiles:
    """Reads inputs and writes outputs for the batch service (see the module doc)."""

    def __init__(self, file_roots: Sequence[Path], s3_buckets: Sequence[str] | None = None,
                 s3_endpoint_url: str | None = None,
                 s3_client: Callable[[], Any] | None = None) -> None:
        self.file_roots = [root.resolve() for root in file_roots]
        self.s3_buckets = None if s3_buckets is None else set(s3_buckets)
        self._make_s3 = s3_client or (lambda: boto3.client(
            "s3", endpoint_url=s3_endpoint_url,
            config=Config(connect_timeout=5, read_timeout=60, retries={"max_attempts": 3})))
        self._s3: Any = None

    def _client(self) -> Any:
        if self._s3 is None:
            self._s3 = self._make_s3()
        return self._s3

    def check(self, uri: str) -> Location:
        """The location of ``uri`` if this service may use it; raises :class:`BatchFileError`
        (``invalid_uri``, ``uri_not_allowed``)."""
        loc = parse_uri(uri)
        if loc.path is not None:
            resolved = loc.path.resolve()
            if not any(resolved.is_relative_to(root) for root in self.file_roots):
                raise BatchFileError("uri_not_allowed", "file:// paths must be under one of the "
                                     "service's file roots.")
            return Location("file", path=resolved)
        if self.s3_buckets is not None and loc.bucket not in self.s3_buckets:
            raise BatchFileError("uri_not_allowed", f"Bucket '{loc.bucket}' is not allowed.")
        return loc

    def read(self, uri: str, max_bytes: int = MAX_INPUT_BYTES) -> bytes:
        """The whole file at ``uri`` (at most ``max_bytes`` bytes)."""
        loc = self.check(uri)
        if loc.path is not None:
            try:
                if loc.path.stat().st_size > max_bytes:
                    raise BatchFileError("input_too_large", f"Input is over {max_bytes} bytes.")
                return loc.path.read_bytes()
            except FileNotFoundError:
                raise BatchFileError("input_not_found", "The input file does not exist.") from None
            except OSError as exc:
                raise BatchFileError("input_unreadable", f"Cannot read the input: "
                                     f"{exc.__class__.__name__}.") from None
        try:
            obj = self._client().get_object(Bucket=loc.bucket, Key=loc.key)
            if int(obj.get("ContentLength", 0)) > max_bytes:
                raise BatchFileError("input_too_large", f"Input is over {max_bytes} bytes.")
            data: bytes = obj["Body"].read()
            return data
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "NoSuchBucket", "404"):
                raise BatchFileError("input_not_found", "The input object does not exist.") from None
            raise BatchFileError("input_unreadable", f"S3 refused the read: {code}.") from None
        except BotoCoreError as exc:
            raise BatchFileError("input_unreadable", f"S3 unreachable: "
                                 f"{exc.__class__.__name__}.") from None

    def write_lines(self, uri: str, lines: Sequence[str]) -> None:
        """Write ``lines`` (JSON text, one per line) to ``uri`` atomically, replacing it."""
        data = "".join(line + "\n" for line in lines).encode()
        loc = self.check(uri)
        if loc.path is not None:
            try:
                _atomic_write(loc.path, data)
            except OSError as exc:
                raise BatchFileError("output_unwritable", f"Cannot write the output: "
                                     f"{exc.__class__.__name__}.") from None
            return
        try:
            self._client().put_object(Bucket=loc.bucket, Key=loc.key, Body=data,
                                      ContentType="application/jsonl")
        except (ClientError, BotoCoreError) as exc:
            raise BatchFileError("output_unwritable", f"S3 refused the write: "
                                 f"{exc.__class__.__name__}.") from None


def _atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, fsync it, rename it over ``path``,
    and fsync the directory so the rename survives a crash."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
