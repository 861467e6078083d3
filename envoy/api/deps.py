"""FastAPI dependencies of the control plane's HTTP API, as ``Annotated`` aliases, and the
admin credential they check.

The admin credential is one bearer token, distinct from every team key: from
``--admin-token-file`` (first line) or the environment variable ``MODELFLEET_ADMIN_TOKEN``.
Every ``/admin/...`` endpoint depends on :func:`admin_access`:

| request | answer |
|---|---|
| ``Authorization: Bearer <admin token>`` | in (compared in constant time) |
| no ``Authorization`` header, or not ``Bearer`` | 401, ``WWW-Authenticate: Bearer`` |
| a team key (its hash is one of the config's ``key_hashes``) | 403: team keys never reach the admin API |
| any other token | 401 |
| no credential configured on the control plane | reads (GET) open as before; changes 403 |
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from modelfleet.config.keyhash import hash_key

TOKEN_ENV = "MODELFLEET_ADMIN_TOKEN"
MIN_TOKEN_CHARS = 16
"""Shortest admin token accepted (a guessable token would make the admin API public)."""


@dataclass(frozen=True)
class AdminPrincipal:
    """Who called an ``/admin/...`` endpoint."""

    name: str


@dataclass(frozen=True)
class AdminCredential:
    """The admin token (None: none configured) and the team key hashes to refuse."""

    token: str | None
    team_key_hashes: Callable[[], frozenset[str]] = field(default=lambda: frozenset())

    def __post_init__(self) -> None:
        if self.token is not None and len(self.token) < MIN_TOKEN_CHARS:
            raise ValueError(f"the admin token must have at least {MIN_TOKEN_CHARS} characters")

    def matches(self, presented: str) -> bool:
        """True when ``presented`` is the admin token (constant-time comparison)."""
        return self.token is not None and hmac.compare_digest(
            presented.encode(), self.token.encode()
        )


def read_admin_token(token_file: Path) -> str:
    """The admin token: the first line of ``token_file`` (``--admin-token-file``; without it the
    settings read the token, :class:`envoy_control.cli_args.ControlPlaneSettings`). Raises OSError
    if the file cannot be read, ValueError if it is empty."""
    lines = token_file.read_text(encoding="utf-8").splitlines()
    token = lines[0].strip() if lines else ""
    if not token:
        raise ValueError(f"{token_file}: empty admin token file")
    return token


_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="AdminToken",
    description="The control plane's admin token (not a team key): "
    "`--admin-token-file` or `MODELFLEET_ADMIN_TOKEN`.",
)


async def admin_access(
    request: Request,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> AdminPrincipal:
    """The check every ``/admin/...`` endpoint depends on (table in the module docstring).

    The credential is ``request.app.state.admin_credential`` (set by the app factory). Tests
    can swap the whole check with ``app.dependency_overrides[admin_access]``.
    """
    credential: AdminCredential | None = getattr(request.app.state, "admin_credential", None)
    if credential is None or credential.token is None:
        if request.method in ("GET", "HEAD"):
            return AdminPrincipal("anonymous")
        raise HTTPException(403, "admin changes are disabled: this control plane has no admin "
                                 f"credential (start it with --admin-token-file or {TOKEN_ENV})")
    if bearer is None:
        raise HTTPException(401, "admin credential required: Authorization: Bearer <admin token>",
                            headers={"WWW-Authenticate": "Bearer"})
    if credential.matches(bearer.credentials):
        return AdminPrincipal("admin")
    if hash_key(bearer.credentials) in credential.team_key_hashes():
        raise HTTPException(403, "a team key cannot use the admin API; use the admin token")
    raise HTTPException(401, "invalid admin credential", headers={"WWW-Authenticate": "Bearer"})


Admin = Annotated[AdminPrincipal, Depends(admin_access)]
"""Declare a parameter ``_: Admin`` to put an endpoint behind :func:`admin_access`."""
