"""Team keys: hashing, constant-time lookup of a presented Bearer key, generation, and the
model/tier permission check.

The config holds only ``sha256:<hex>`` hashes of keys (``Team.key_hashes``). A presented key is
hashed once and compared with :func:`hmac.compare_digest` against *every* known hash, without
stopping at a match, so the time taken says nothing about which hash (or how much of it) matched.
Outcomes are values: :class:`Authenticated` or an :class:`~modelfleet.contract.errors.ApiError` (401/403).
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from modelfleet.config.keyhash import (
    hash_key as hash_key,  # re-exported: the tests and callers hash keys here
)
from modelfleet.config.schema import Team, TeamLimit, Tier
from modelfleet.contract.errors import ApiError, forbidden, unauthenticated
from modelfleet.contract.headers import PRIORITY_HEADER

KEY_PREFIX = "mf-"
"""Every generated key starts with this, so leaked keys are easy to find by secret scanners."""
KEY_RANDOM_BYTES = 32
"""Random bytes in a generated key (256 bits; 43 URL-safe base64 characters)."""


def generate_key(token_urlsafe: Callable[[int], str] = secrets.token_urlsafe) -> str:
    """A new team key: ``mf-`` + URL-safe random text from ``KEY_RANDOM_BYTES`` random bytes.

    ``token_urlsafe`` is injectable for tests; the default is the OS's CSPRNG.
    """
    return KEY_PREFIX + token_urlsafe(KEY_RANDOM_BYTES)


def bearer_token(authorization: str | None) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header value; None if absent or not Bearer."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


@dataclass(frozen=True, slots=True)
class Authenticated:
    """The presented key belongs to ``team``."""

    team: Team


class KeyRing:
    """Every team's key hashes; answers which team a presented key belongs to.

    Built from the config's teams; rebuild it when the config changes (it is immutable).
    """

    def __init__(self, teams: Iterable[Team]) -> None:
        entries: list[tuple[bytes, Team]] = []
        for team in teams:
            entries.extend((h.encode(), team) for h in team.key_hashes)
        self._entries = tuple(entries)

    def __len__(self) -> int:
        return len(self._entries)

    def authenticate(self, authorization: str | None) -> Authenticated | ApiError:
        """The team of the ``Authorization`` header's Bearer key, or a 401.

        Compares the key's hash with every known hash in constant time per hash and never
        stops early.
        """
        key = bearer_token(authorization)
        if key is None:
            return unauthenticated(
                "Missing API key: send 'Authorization: Bearer <team key>'.", code="missing_api_key")
        presented = hash_key(key).encode()
        found: Team | None = None
        for known, team in self._entries:
            if hmac.compare_digest(presented, known) and found is None:
                found = team
        if found is None:
            return unauthenticated("Incorrect API key provided.")
        return Authenticated(found)


def authorize(team: Team, model: str, tier: Tier) -> TeamLimit | ApiError:
    """``team``'s limit on ``model`` if it may send ``tier`` requests to it, else a 403.

    A team may use a model only if it has a ``limits`` entry for it, and only the tiers listed
    there.
    """
    limit = next((lim for lim in team.limits if lim.model == model), None)
    if limit is None:
        return forbidden(f"Team '{team.name}' has no access to model '{model}'.", param="model")
    if tier not in limit.tiers:
        allowed = ", ".join(limit.tiers)
        return forbidden(
            f"Team '{team.name}' may not send '{tier}' requests to '{model}' (allowed: {allowed}).",
            param=PRIORITY_HEADER, code="tier_not_allowed")
    return limit
