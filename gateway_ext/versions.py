"""Which version of a model a request goes to (pure).

* ``name@vN``: that version.
* ``name``: the canary gets ``canary.percent`` of *conversations*: the split point is a hash of
  ``x-conversation-id`` (so every turn of a conversation lands on the same version, in every
  gateway process), or a random draw per request when the request has no conversation id.
  Everything else goes to the live version (the alias).

Conversation pinning (a conversation keeps its version across a canary change) plugs in here with
the routing issue; this module stays a function of plain data.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable

from gateway_ext.request import ChatRequest
from modelfleet.config.schema import Model, PlatformConfig


def split_point(conversation_id: str) -> float:
    """A stable point in [0, 1) for ``conversation_id`` (64 bits of BLAKE2b)."""
    digest = hashlib.blake2b(conversation_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def choose_version(model: Model, explicit: str | None, conversation_id: str | None,
                   draw: float) -> str:
    """The version (``v13``) for a request to ``model``: ``explicit`` if given, else the canary
    when the conversation's split point (``draw``, in [0, 1), without a conversation id) falls in
    its ``percent``, else the live version."""
    if explicit is not None:
        return explicit
    canary = model.canary
    if canary is not None and canary.percent > 0:
        point = split_point(conversation_id) if conversation_id else draw
        if point * 100 < canary.percent:
            return canary.version
    return model.live


def version_chooser(config: PlatformConfig, rng: random.Random) -> Callable[[ChatRequest], str]:
    """:func:`choose_version` over ``config`` for :class:`~gateway_ext.decision.GatewayCore`;
    ``rng`` draws the split point of requests without a conversation id."""

    def choose(request: ChatRequest) -> str:
        model = config.model(request.model)
        if model is None:
            raise ValueError(f"unknown model {request.model!r}")
        draw = rng.random() if request.conversation_id is None else 0.0
        return choose_version(model, request.version, request.conversation_id, draw)

    return choose
