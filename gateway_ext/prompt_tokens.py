"""Prompt-token estimators: how many tokens a request's messages will be once templated.

The gateway charges a team's bucket with ``prompt estimate + max_tokens`` before any GPU work and
settles with the replica's real count afterwards, so an estimate only has to be close; a low
estimate is charged later (see :mod:`gateway_ext.limits.buckets`).

An estimator is any callable ``(messages) -> tokens``. A version that ships its tokenizer plugs in
its own (for example a ``transformers`` tokenizer with the version's chat template); the gateway
picks one per model name (:func:`estimator_for`).

* :data:`SIMULATED_CHATML` (the default) counts exactly as the simulated replica does: its
  tokenizer and ChatML template from :mod:`modelfleet.contract.tokens`, so estimate == the replica's
  ``usage.prompt_tokens`` in the local stack. :class:`CachedChatMLEstimator` gives the same count
  with a per-message memo (the tokenizer's regex costs about 0.2 us per token, most of a decision).
* :class:`BytesEstimator` is a tokenizer-free estimate for a model whose tokenizer the gateway
  lacks: one token per ``bytes_per_token`` UTF-8 bytes (default 3) plus a per-message overhead.
  BPE tokenizers of the Llama/Mistral families average about 4 bytes per token on English prose,
  so it errs high there; punctuation-dense text or code can exceed it (the settle charges the
  difference).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from modelfleet.contract import tokens


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message as the template sees it: ``role`` and its text ``content``."""

    role: str
    content: str


class PromptTokenEstimator(Protocol):
    """Estimates the prompt tokens (after the chat template) of ``messages``."""

    def __call__(self, messages: Sequence[Message], /) -> int:
        """Prompt tokens of ``messages``, generation prompt included."""
        ...


def simulated_chatml(messages: Sequence[Message], /) -> int:
    """Prompt tokens of ``messages`` through the simulated replica's tokenizer and ChatML template."""
    return tokens.count(tokens.render_chat((m.role, m.content) for m in messages))


SIMULATED_CHATML: PromptTokenEstimator = simulated_chatml
"""The default estimator: exact for the simulated replica."""


class CachedChatMLEstimator:
    """:func:`simulated_chatml` with a per-message memo: the same count, computed once per message.

    Every turn of a conversation resends its history, so most messages of a request were counted
    before. The simulated tokenizer never lets a token span whitespace and every templated message
    ends with a newline, so a prompt's count is the sum of its messages' counts plus the generation
    prompt's. The memo holds at most ``max_entries`` messages (least recently used go first), keyed
    by Python's 64-bit string hash (a collision would only misestimate one prompt; settle corrects
    it). One instance per service or simulator; not thread-safe.
    """

    def __init__(self, max_entries: int = 100_000) -> None:
        self.max_entries = max_entries
        self._counts: OrderedDict[int, int] = OrderedDict()
        self._generation = tokens.count(tokens.render_chat(()))

    def __len__(self) -> int:
        """Messages remembered."""
        return len(self._counts)

    def message_tokens(self, message: Message) -> int:
        """Tokens of one templated message (tokens)."""
        key = hash((message.role, message.content))
        count = self._counts.get(key)
        if count is not None:
            self._counts.move_to_end(key)
            return count
        count = tokens.count(tokens.render_chat([(message.role, message.content)]))
        count -= self._generation
        self._counts[key] = count
        if len(self._counts) > self.max_entries:
            self._counts.popitem(last=False)
        return count

    def __call__(self, messages: Sequence[Message], /) -> int:
        """Prompt tokens of ``messages``, generation prompt included (as :func:`simulated_chatml`)."""
        return self._generation + sum(self.message_tokens(m) for m in messages)


@dataclass(frozen=True, slots=True)
class BytesEstimator:
    """Tokenizer-free estimate: ``ceil(bytes / bytes_per_token)`` per message plus
    ``overhead_tokens`` per message and ``generation_tokens`` once (tokens)."""

    bytes_per_token: float = 3.0
    overhead_tokens: int = 4
    generation_tokens: int = 3

    def __call__(self, messages: Sequence[Message], /) -> int:
        """Estimated prompt tokens of ``messages``."""
        total = self.generation_tokens
        for m in messages:
            size = len(m.role.encode()) + len(m.content.encode())
            total += self.overhead_tokens + math.ceil(size / self.bytes_per_token)
        return total


def estimator_for(model: str, overrides: Mapping[str, PromptTokenEstimator] | None = None,
                  default: PromptTokenEstimator = SIMULATED_CHATML) -> PromptTokenEstimator:
    """The estimator for ``model`` (a model name): its override if any, else ``default``."""
    if overrides is not None and model in overrides:
        return overrides[model]
    return default
