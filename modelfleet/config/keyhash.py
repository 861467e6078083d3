"""How a team key is stored in the config: only its hash, never the key."""

from __future__ import annotations

import hashlib


def hash_key(key: str) -> str:
    """The config form of ``key``: ``sha256:`` + the hex SHA-256 of its UTF-8 bytes."""
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()
