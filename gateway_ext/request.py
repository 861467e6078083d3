"""From the raw body bytes and headers of ``POST /v1/chat/completions`` to a typed
:class:`ChatRequest`, or an :class:`~modelfleet.contract.errors.ApiError` (400/404/413).

Checks, in order: body size (413), JSON object (400), ``model`` known as ``name`` or
``name@vN`` (404), ``messages`` (400), ``max_tokens``/``max_completion_tokens``, ``n`` and
``stream`` (400), then the headers ``x-priority`` (400) and ``x-conversation-id`` (400 if too long).

``max_tokens`` when absent: the gateway reserves the most the answer may use, which is
``min(model.max_output_tokens, context - prompt estimate)`` where ``context`` is the smallest
``engine_config.max_model_len`` among the versions the request may reach (the explicit version, or
the live and canary versions). OpenAI's default is "up to the context", so reserving less could let a
team exceed its limit; the unused part is refunded at settle. A prompt or ``max_tokens`` that
overflows the context is left for the replica to refuse (with the real tokenizer); its reservation is
then settled with zero usage, so it costs nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway_ext.prompt_tokens import (
    SIMULATED_CHATML,
    Message,
    PromptTokenEstimator,
    estimator_for,
)
from modelfleet.config.schema import TIERS, Model, PlatformConfig, Tier, Version
from modelfleet.contract.errors import ApiError, invalid, not_found, too_large
from modelfleet.contract.headers import CONVERSATION_HEADER, PRIORITY_HEADER

DEFAULT_MAX_BODY_BYTES = 1 << 20
"""Largest accepted body, in bytes (1 MiB)."""
DEFAULT_TIER: Tier = "standard"
MAX_CONVERSATION_ID_CHARS = 256
"""Longest accepted ``x-conversation-id``, in characters."""


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A checked chat request.

    ``model`` is the model name; ``version`` is set when the client asked for ``name@vN``.
    ``max_tokens`` is the output reservation per choice in tokens (``max_tokens_given`` says whether
    the client chose it); ``prompt_tokens`` is the estimate in tokens.
    """

    model: str
    version: str | None
    messages: tuple[Message, ...]
    max_tokens: int
    max_tokens_given: bool
    n: int
    stream: bool
    tier: Tier
    conversation_id: str | None
    prompt_tokens: int

    @property
    def reserve_tokens(self) -> int:
        """Tokens charged at admission: prompt estimate + ``n`` x ``max_tokens``."""
        return self.prompt_tokens + self.n * self.max_tokens


def header(headers: Mapping[str, str], name: str) -> str | None:
    """The value of header ``name`` (lower-case) in ``headers``, whatever their case."""
    value = headers.get(name)
    if value is not None:
        return value
    return next((v for k, v in headers.items() if k.lower() == name), None)


def parse_tier(value: str | None) -> Tier | ApiError:
    """The tier of an ``x-priority`` value (case-insensitive); ``standard`` when absent or empty."""
    if value is None or not value.strip():
        return DEFAULT_TIER
    tier = value.strip().lower()
    if tier not in TIERS:
        return invalid(f"x-priority must be one of {', '.join(TIERS)}; got '{value}'.",
                       param=PRIORITY_HEADER, code="invalid_priority")
    return tier


def resolve_model(config: PlatformConfig, name: str) -> tuple[Model, Version | None] | ApiError:
    """The model of ``name`` or ``name@vN`` and the explicit version if any; 404 if undeclared."""
    model_name, _, version_name = name.partition("@")
    model = config.model(model_name)
    if model is None:
        return not_found(f"The model '{name}' does not exist.")
    if not version_name:
        return model, None
    version = config.version(model_name, version_name)
    if version is None:
        return not_found(f"The model '{name}' does not exist: '{model_name}' has no version "
                         f"'{version_name}'.")
    return model, version


def context_tokens(config: PlatformConfig, model: Model, version: Version | None) -> int | None:
    """Smallest ``max_model_len`` (tokens) among the versions a request for ``model`` may reach."""
    if version is not None:
        return version.engine_config.max_model_len
    names = {model.live} | ({model.canary.version} if model.canary else set())
    lens = [v.engine_config.max_model_len for v in config.versions_of(model.name)
            if v.version in names]
    return min(lens) if lens else None


def parse_messages(raw: Any) -> tuple[Message, ...] | ApiError:
    """Messages of a body's ``messages``: a non-empty list of ``{role, content}`` objects whose
    content is a string, null, or a list of parts (text parts joined by newlines, as the replica
    does)."""
    if raw is None:
        return invalid("'messages' is required.", param="messages")
    if not isinstance(raw, list):
        return invalid("'messages' must be an array.", param="messages")
    if not raw:
        return invalid("'messages' must not be empty.", param="messages")
    out: list[Message] = []
    for i, item in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(item, dict):
            return invalid(f"'{where}' must be an object.", param=where)
        role = item.get("role")
        if not isinstance(role, str) or not role:
            return invalid(f"'{where}.role' must be a non-empty string.", param=f"{where}.role")
        content = _content_text(item.get("content"))
        if content is None:
            return invalid(f"'{where}.content' must be a string, null or an array of parts.",
                           param=f"{where}.content")
        out.append(Message(role, content))
    return tuple(out)


def _content_text(content: Any) -> str | None:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    texts: list[str] = []
    for part in content:
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            return None
        if part["type"] == "text":
            if not isinstance(part.get("text"), str):
                return None
            texts.append(part["text"])
    return "\n".join(texts)


def _positive_int(body: Mapping[str, Any], key: str) -> int | ApiError | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return invalid(f"'{key}' must be a positive integer; got {json.dumps(value)}.", param=key)
    return value


def _max_tokens(body: Mapping[str, Any], model: Model) -> int | ApiError | None:
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    value = _positive_int(body, key)
    if isinstance(value, int) and value > model.max_output_tokens:
        return invalid(f"'{key}' is {value}; the most '{model.name}' allows is "
                       f"{model.max_output_tokens}.", param=key)
    return value


def parse_chat_request(
    body: bytes,
    headers: Mapping[str, str],
    config: PlatformConfig,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    estimators: Mapping[str, PromptTokenEstimator] | None = None,
    default_estimator: PromptTokenEstimator = SIMULATED_CHATML,
) -> ChatRequest | ApiError:
    """A :class:`ChatRequest` from ``body`` (bytes) and ``headers``, or the first error found.

    ``max_body_bytes`` is the body limit in bytes; ``estimators`` overrides the prompt-token
    estimator per model name, ``default_estimator`` serves the others.
    """
    if len(body) > max_body_bytes:
        return too_large(max_body_bytes, len(body))
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:
        return invalid(f"The body is not valid JSON: {exc}.", code="invalid_json")
    if not isinstance(data, dict):
        return invalid("The body must be a JSON object.", code="invalid_json")
    name = data.get("model")
    if not isinstance(name, str) or not name:
        return invalid("'model' must be a non-empty string.", param="model")
    resolved = resolve_model(config, name)
    if isinstance(resolved, ApiError):
        return resolved
    model, version = resolved
    messages = parse_messages(data.get("messages"))
    if isinstance(messages, ApiError):
        return messages
    max_tokens = _max_tokens(data, model)
    n = _positive_int(data, "n")
    if isinstance(max_tokens, ApiError):
        return max_tokens
    if isinstance(n, ApiError):
        return n
    stream = data.get("stream")
    if stream is not None and not isinstance(stream, bool):
        return invalid("'stream' must be a boolean.", param="stream")
    estimate = estimator_for(model.name, estimators, default_estimator)
    return _with_headers(headers, config, model, version, messages, max_tokens, n or 1,
                         bool(stream), estimate)


def _with_headers(headers: Mapping[str, str], config: PlatformConfig, model: Model,
                  version: Version | None, messages: Sequence[Message], max_tokens: int | None,
                  n: int, stream: bool, estimate: PromptTokenEstimator) -> ChatRequest | ApiError:
    tier = parse_tier(header(headers, PRIORITY_HEADER))
    if isinstance(tier, ApiError):
        return tier
    conversation_id = (header(headers, CONVERSATION_HEADER) or "").strip() or None
    if conversation_id is not None and len(conversation_id) > MAX_CONVERSATION_ID_CHARS:
        return invalid(f"x-conversation-id is longer than {MAX_CONVERSATION_ID_CHARS} characters.",
                       param=CONVERSATION_HEADER)
    prompt = estimate(messages)
    given = max_tokens is not None
    if max_tokens is None:
        context = context_tokens(config, model, version)
        room = model.max_output_tokens if context is None else context - prompt
        max_tokens = max(1, min(model.max_output_tokens, room))
    return ChatRequest(model.name, version.version if version else None, tuple(messages),
                       max_tokens, given, n, stream, tier, conversation_id, prompt)
