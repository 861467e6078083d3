"""The OpenAI-compatible wire format, shaped as vLLM's OpenAI server shapes it.

Request bodies are pydantic models that, like vLLM's, accept and ignore unknown fields. Responses
are plain dicts serialised compactly, with the fields vLLM sends: a streamed chunk carries
``logprobs: null`` and ``finish_reason``; the chunk that finishes a choice adds ``stop_reason``;
the usage chunk has empty ``choices``; ``prompt_tokens_details`` appears only when the prefix
cache served some prompt tokens (vLLM omits it, or sends null, when there were none).
Errors are ``{"error": {"message", "type", "param", "code"}}`` with ``code`` the HTTP status.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict


class ContentPart(BaseModel):
    """One part of a message's content; only text parts add tokens."""

    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    """One chat message."""

    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        """The message's text: the string, or its text parts joined by newlines."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(p.text for p in self.content if p.type == "text" and p.text is not None)


class StreamOptions(BaseModel):
    """``stream_options``; as in vLLM, ``include_usage`` defaults to true once the object is sent."""

    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class ChatCompletionRequest(BaseModel):
    """The body of ``POST /v1/chat/completions`` (fields this replica honours or checks)."""

    model_config = ConfigDict(extra="allow")
    messages: list[ChatMessage]
    model: str | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    """vLLM extension: generate ``max_tokens`` tokens whatever the model would do."""
    min_tokens: int = 0
    """vLLM extension: no end token or stop string before this many tokens."""

    def stop_strings(self) -> list[str]:
        """``stop`` as a list."""
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


def dumps(obj: Any) -> str:
    """Compact JSON, as pydantic's ``model_dump_json`` writes it."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def error_body(message: str, err_type: str, code: int, param: str | None = None) -> dict[str, Any]:
    """vLLM's ``ErrorResponse``: ``code`` is the HTTP status as an integer."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """The ``usage`` object; ``prompt_tokens_details`` only when some prompt tokens were cached."""
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
    if cached_tokens:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return out


class ChunkWriter:
    """Server-sent events of one streamed chat completion."""

    def __init__(self, completion_id: str, created: int, model: str) -> None:
        head = dumps({"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model})
        self._head = head[:-1]  # '{"id":...,"model":"..."' to which each chunk adds its choices

    def _event(self, rest: str) -> str:
        return f"data: {self._head},{rest}}}\n\n"

    def role(self) -> str:
        """The first chunk: the assistant role and empty content."""
        return self._event('"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
                           '"logprobs":null,"finish_reason":null}]')

    def content(self, text: str) -> str:
        """A chunk with ``text`` as the content delta."""
        return self._event(f'"choices":[{{"index":0,"delta":{{"content":{dumps(text)}}},'
                           '"logprobs":null,"finish_reason":null}]')

    def finish(self, text: str, finish_reason: str, stop_reason: str | None) -> str:
        """The chunk that ends the choice: last delta, ``finish_reason`` and ``stop_reason``."""
        return self._event(f'"choices":[{{"index":0,"delta":{{"content":{dumps(text)}}},'
                           f'"logprobs":null,"finish_reason":{dumps(finish_reason)},'
                           f'"stop_reason":{dumps(stop_reason)}}}]')

    def usage(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> str:
        """The usage chunk sent when ``stream_options.include_usage`` is true."""
        return self._event(f'"choices":[],"usage":{dumps(usage(prompt_tokens, completion_tokens, cached_tokens))}')

    @staticmethod
    def done() -> str:
        """The end of the stream."""
        return "data: [DONE]\n\n"


def completion_body(
    completion_id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str,
    stop_reason: str | None,
    usage_obj: dict[str, Any],
) -> dict[str, Any]:
    """A non-streamed ``chat.completion``."""
    u = dict(usage_obj)
    u.setdefault("prompt_tokens_details", None)
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None, "tool_calls": []},
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": stop_reason,
            }
        ],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": u,
        "prompt_logprobs": None,
    }


def models_body(names: list[str], root: str, max_model_len: int, created: int) -> dict[str, Any]:
    """``GET /v1/models``: one card per served name, as vLLM lists ``--served-model-name``."""
    return {
        "object": "list",
        "data": [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": root,
                "parent": None,
                "max_model_len": max_model_len,
                "permission": [],
            }
            for name in names
        ],
    }
