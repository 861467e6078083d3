"""Batch input and output files by URI (I/O edge): ``file://`` (the local default) and ``s3://``.

Output is written atomically: a local file goes to a temporary file in the same directory
(fsynced) that is renamed over the target; an S3 object is one ``PutObject`` of the whole file,
which S3 shows whole or not at all. A reader never sees half an output.

The service reads and writes with its own rights, on behalf of any team, so it confines them
per team (``check(uri, team)``):

* ``file://`` paths must lie under one of ``file_roots`` (symlinks resolved). A root holding
  ``{team}`` (``/data/batches/{team}``) is that team's alone; a root without it is shared by
  every team (a single-tenant setup). ``files_dir/<team>`` (uploads through ``/v1/files`` and
  their outputs) is the team's too, and no other team may name a path in it even when it lies
  under a shared root.
* ``s3://`` URIs must start with one of ``s3_buckets`` when that list is given: ``bucket`` (the
  whole bucket, shared) or ``bucket/prefix/{team}/`` (that team's prefix).

Errors are :class:`BatchFileError` values with a short code and a message that never quotes file
content.
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
TEAM_PLACEHOLDER = "{team}"


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
                 s3_client: Callable[[], Any] | None = None,
                 files_dir: Path | None = None) -> None:
        self.file_roots = list(file_roots)
        self.s3_buckets = None if s3_buckets is None else list(s3_buckets)
        self.files_dir = None if files_dir is None else files_dir.resolve()
        self._make_s3 = s3_client or (lambda: boto3.client(
            "s3", endpoint_url=s3_endpoint_url,
            config=Config(connect_timeout=5, read_timeout=60, retries={"max_attempts": 3})))
        self._s3: Any = None

    def _client(self) -> Any:
        if self._s3 is None:
            self._s3 = self._make_s3()
        return self._s3

    def team_dir(self, team: str) -> Path | None:
        """Where ``team``'s uploads and their outputs live (None: no uploads)."""
        return None if self.files_dir is None else self.files_dir / team

    def roots(self, team: str | None) -> list[Path]:
        """The directories ``team`` may name (resolved; team-only roots need a team)."""
        out = [Path(str(r).replace(TEAM_PLACEHOLDER, team)) if team else r
               for r in self.file_roots if team or TEAM_PLACEHOLDER not in str(r)]
        own = self.team_dir(team) if team else None
        return [r.resolve() for r in out] + ([own] if own is not None else [])

    def check(self, uri: str, team: str | None = None) -> Location:
        """The location of ``uri`` if this service may use it for ``team`` (None: only shared
        roots and buckets); raises :class:`BatchFileError` (``invalid_uri``,
        ``uri_not_allowed``)."""
        loc = parse_uri(uri)
        if loc.path is not None:
            resolved = loc.path.resolve()
            own = self.team_dir(team) if team else None
            if not any(resolved.is_relative_to(root) for root in self.roots(team)) or (
                    self.files_dir is not None and resolved.is_relative_to(self.files_dir)
                    and (own is None or not resolved.is_relative_to(own))):
                raise BatchFileError("uri_not_allowed", "file:// paths must be under one of "
                                     "your team's file roots.")
            return Location("file", path=resolved)
        if self.s3_buckets is not None and not any(
                _s3_allows(entry, team, loc) for entry in self.s3_buckets):
            raise BatchFileError("uri_not_allowed", f"s3://{loc.bucket}/ with this prefix is "
                                 "not allowed for your team.")
        return loc

    def read(self, uri: str, max_bytes: int = MAX_INPUT_BYTES, team: str | None = None) -> bytes:
        """The whole file at ``uri`` (at most ``max_bytes`` bytes), read for ``team``."""
        loc = self.check(uri, team)
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

    def write_lines(self, uri: str, lines: Sequence[str], team: str | None = None) -> None:
        """Write ``lines`` (JSON text, one per line) to ``uri`` atomically for ``team``,
        replacing it."""
        data = "".join(line + "\n" for line in lines).encode()
        loc = self.check(uri, team)
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


def _s3_allows(entry: str, team: str | None, loc: Location) -> bool:
    """Whether ``--s3-bucket`` ``entry`` (``bucket`` or ``bucket/prefix``, maybe with
    ``{team}``) covers ``loc`` for ``team``."""
    if TEAM_PLACEHOLDER in entry:
        if not team:
            return False
        entry = entry.replace(TEAM_PLACEHOLDER, team)
    bucket, _, prefix = entry.partition("/")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return loc.bucket == bucket and loc.key.startswith(prefix)


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`_atomic_write`)."""
    _atomic_write(path, data)


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
