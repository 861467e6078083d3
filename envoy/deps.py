"""FastAPI dependencies of the control plane's HTTP API, as ``Annotated`` aliases."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends


@dataclass(frozen=True)
class AdminPrincipal:
    """Who called an ``/admin/...`` endpoint."""

    name: str


async def admin_access() -> AdminPrincipal:
    """The hook every ``/admin/...`` endpoint depends on: for now it lets everyone in.

    The admin credential arrives in a later issue: check it here and raise
    ``HTTPException(401)``/``(403)``; nothing else changes. Tests can swap it with
    ``app.dependency_overrides[admin_access]``.
    """
    return AdminPrincipal("anonymous")


Admin = Annotated[AdminPrincipal, Depends(admin_access)]
"""Declare a parameter ``_: Admin`` to put an endpoint behind :func:`admin_access`."""
