"""Talking to a control plane's admin API from the command line: where it is, the admin token.

The URL is ``--url`` (or ``--against``), else ``admin_url`` in ``.modelfleet/local.json`` (a
local stack started from here). The token is the first line of ``--token-file``, else
``$MODELFLEET_ADMIN_TOKEN``, else ``admin_token`` in ``.modelfleet/local.json``.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from modelfleet.local.state import read_state, state_path

TOKEN_ENV = "MODELFLEET_ADMIN_TOKEN"


class AdminError(Exception):
    """The control plane could not be reached, or refused the call; the message says why."""


def add_connection_args(p: argparse.ArgumentParser, url_flag: bool = True) -> None:
    """``--url`` (optional) and ``--token-file``."""
    if url_flag:
        p.add_argument("--url", default=None,
                       help="control plane HTTP URL (default: admin_url of .modelfleet/local.json)")
    p.add_argument("--token-file", type=Path, default=None,
                   help=f"file with the admin token (default: ${TOKEN_ENV}, then .modelfleet/local.json)")


def local_facts() -> dict[str, Any]:
    """``.modelfleet/local.json`` of a local stack started from here, or {}."""
    return read_state(state_path()) or {}


def resolve_url(url: str | None) -> str:
    """``url``, else the local stack's ``admin_url``; raises :class:`AdminError`."""
    found = url or local_facts().get("admin_url")
    if not found:
        raise AdminError("no control plane URL: give --url (or start `modelfleet up` here)")
    return str(found).rstrip("/")


def resolve_token(token_file: Path | None) -> str | None:
    """The admin token (see the module docstring), or None."""
    if token_file is not None:
        lines = token_file.read_text(encoding="utf-8").splitlines()
        return lines[0].strip() if lines and lines[0].strip() else None
    return os.environ.get(TOKEN_ENV) or local_facts().get("admin_token") or None


@dataclass
class AdminClient:
    """Calls ``url``'s admin API with ``token`` (timeouts in seconds)."""

    url: str
    token: str | None
    timeout_s: float = 10.0

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        """One call; returns the status and the decoded JSON. Raises :class:`AdminError` when
        the control plane cannot be reached."""
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            r = httpx.request(method, self.url + path, json=body, headers=headers,
                              timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            raise AdminError(f"{self.url}: {exc}") from None
        try:
            return r.status_code, r.json()
        except ValueError:
            return r.status_code, {"detail": r.text}

    def desired(self) -> dict[str, Any]:
        """``GET /admin/desired``; raises :class:`AdminError` unless 200."""
        status, data = self.call("GET", "/admin/desired")
        if status != 200:
            raise AdminError(f"{self.url}/admin/desired: {status} {detail(data)}")
        return dict(data)


def detail(data: Any) -> str:
    """A readable one-line summary of an error answer (422 problems included)."""
    d = data.get("detail", data) if isinstance(data, dict) else data
    if isinstance(d, dict) and "problems" in d:
        reasons = "; ".join(f"{p['path']}: {p['message']}" for p in d["problems"]
                            if p.get("severity") == "error")
        return f"{d.get('message', '')}: {reasons}"
    if isinstance(d, dict) and "message" in d:
        return str(d["message"])
    return str(d)
