"""Which version of a model a request goes to (pure; the pin store is the only memory).

* ``name@vN``: that version, never pinned.
* ``name`` with ``x-conversation-id``: the version the conversation is **pinned** to, as long as
  that version is still the alias's live or canary version. A conversation without a valid pin
  gets a new choice, which is pinned (:func:`settle_pin`): the canary iff the conversation's
  split point (a 64-bit BLAKE2b of its id, in [0, 1)) is below ``canary_percent / 100``, else
  the live version. The gateway scopes a conversation by team and model
  (:func:`conversation_key`): two teams that reuse an id are two conversations.
* ``name`` without a conversation id: the same comparison with a random draw per request.

Why pins and not the hash alone: a hash split is monotone in the percent (raising 10% -> 50%
only moves points from live to canary), but it *does* move every conversation whose point lies
in [0.10, 0.50) to the canary halfway through. The pin remembers the version a conversation
started on, so raising, lowering or holding the percent never moves a conversation; only new
conversations see the new split. A pin stops holding when its version leaves the alias (a
rollback removes the canary: its conversations go back to live; a promotion retires the old
live: its conversations move to the new one); the pin is then rewritten.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Collection
from dataclasses import dataclass
from enum import StrEnum

from gateway_ext.request import ChatRequest
from modelfleet.config.schema import Model, PlatformConfig
from modelfleet.contract.router_state_types import ModelAlias


class VersionReason(StrEnum):
    """How a request's version was chosen."""

    EXPLICIT = "explicit"   # model@vN in the body
    PINNED = "pinned"       # the conversation's pin still holds
    SPLIT = "split"         # a conversation's first turn (or its pin lapsed): split point, pinned
    DRAW = "draw"           # no conversation id: a random draw per request


@dataclass(frozen=True)
class VersionChoice:
    """The version (``v13``) and why."""

    version: str
    reason: VersionReason


def split_point(conversation_id: str) -> float:
    """A stable point in [0, 1) for ``conversation_id`` (64 bits of BLAKE2b)."""
    digest = hashlib.blake2b(conversation_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def conversation_key(team: str | None, model: str, conversation_id: str) -> str:
    """The id a conversation's split point is drawn from: (team, model, conversation id), so two
    teams (or two models) reusing a conversation id split and pin independently. Team and model
    names cannot hold the separator."""
    return f"{team or ''}/{model}/{conversation_id}"


def alias_of(model: Model) -> ModelAlias:
    """The alias a config ``Model`` declares (what the router state carries)."""
    return ModelAlias(
        model=model.name, live=model.live,
        canary=model.canary.version if model.canary else None,
        canary_percent=model.canary.percent if model.canary else 0.0,
        shadow=model.shadow.version if model.shadow else None,
        shadow_fraction=model.shadow.fraction if model.shadow else 0.0,
    )


def split(alias: ModelAlias, point: float) -> str:
    """The version a point in [0, 1) falls on: the canary iff ``point < canary_percent / 100``."""
    if alias.canary is not None and point * 100 < alias.canary_percent:
        return alias.canary
    return alias.live


def pin_targets(alias: ModelAlias) -> tuple[str, ...]:
    """Versions a pin may hold: the live version and the canary (if any)."""
    return (alias.live,) if alias.canary is None else (alias.live, alias.canary)


def settle_pin(existing: str | None, candidate: str,
               valid: Collection[str]) -> tuple[str, bool]:
    """``(version, write)``: the existing pin if it is one of ``valid``, else ``candidate``, which
    must then be written. The memory and Redis pin stores both apply this rule."""
    if existing is not None and existing in valid:
        return existing, False
    return candidate, True


def choose(alias: ModelAlias, explicit: str | None, conversation_id: str | None,
           draw: float) -> VersionChoice:
    """The version without memory: ``explicit``, else the split of the conversation's point (or
    of ``draw`` in [0, 1) without a conversation id). Pinning wraps this (see the module)."""
    if explicit is not None:
        return VersionChoice(explicit, VersionReason.EXPLICIT)
    if conversation_id:
        return VersionChoice(split(alias, split_point(conversation_id)), VersionReason.SPLIT)
    return VersionChoice(split(alias, draw), VersionReason.DRAW)


def choose_version(model: Model, explicit: str | None, conversation_id: str | None,
                   draw: float) -> str:
    """:func:`choose` over a config ``Model`` (no pinning): the version name (``v13``)."""
    return choose(alias_of(model), explicit, conversation_id, draw).version


def version_chooser(config: PlatformConfig, rng: random.Random) -> Callable[[ChatRequest], str]:
    """:func:`choose_version` over ``config`` without pinning (tests, the simulator's default);
    ``rng`` draws the split point of requests without a conversation id. The gateway service uses
    :class:`gateway_ext.routing.router.Router`, which pins."""

    def chooser(request: ChatRequest) -> str:
        model = config.model(request.model)
        if model is None:
            raise ValueError(f"unknown model {request.model!r}")
        draw = rng.random() if request.conversation_id is None else 0.0
        return choose_version(model, request.version, request.conversation_id, draw)

    return chooser


@dataclass(frozen=True, slots=True)
class PinAsk:
    """A split conversation's version, to settle with the pin store: ``candidate`` unless the
    conversation is pinned to one of ``valid``."""

    team: str
    model: str
    conversation_id: str
    candidate: str
    valid: tuple[str, ...]

    def args(self) -> tuple[str, str, str, str, tuple[str, ...]]:
        """The arguments of :meth:`~gateway_ext.routing.pins.PinStore.resolve`."""
        return self.team, self.model, self.conversation_id, self.candidate, self.valid
