"""The simulated tokenizer, chat template and prefix-cache block hashes (pure functions).

Tokenizer: a token is a special marker such as ``<|im_start|>``, a run of word characters
(letters, digits, underscore), or one punctuation character; whitespace separates tokens and is
not a token. ``"Hello, world!"`` is 4 tokens. A token's id is the CRC-32 of its text, so ids are
stable across processes and machines.

Chat template (ChatML)::

    <|im_start|>{role}\\n{content}<|im_end|>\\n      per message: 3 tokens plus the content
    <|im_start|>assistant\\n                         generation prompt: 2 tokens

The assistant's answer ends with ``<|im_end|>``, so the next turn of a conversation starts with
exactly the previous prompt's tokens followed by the previous answer's tokens.
"""

from __future__ import annotations

import hashlib
import re
import zlib
from array import array
from collections.abc import Iterable, Sequence

_TOKEN_RE = re.compile(r"<\|[a-z_]+\|>|\w+|[^\w\s]")

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
MESSAGE_OVERHEAD_TOKENS = 3
"""Tokens the template adds around each message's content: start marker, role, end marker."""
GENERATION_PROMPT_TOKENS = 2
"""Tokens of the generation prompt: start marker and ``assistant``."""


def pieces(text: str) -> list[str]:
    """The token strings of ``text``."""
    return _TOKEN_RE.findall(text)


def token_id(piece: str) -> int:
    """The id of one token string: its CRC-32."""
    return zlib.crc32(piece.encode())


EOS_TOKEN_ID = token_id(IM_END)
"""The token that ends an answer; it counts as an output token but adds no text."""


def encode(text: str) -> list[int]:
    """Token ids of ``text``."""
    return [zlib.crc32(p.encode()) for p in _TOKEN_RE.findall(text)]


def count(text: str) -> int:
    """Number of tokens in ``text``."""
    return len(_TOKEN_RE.findall(text))


def render_chat(messages: Iterable[tuple[str, str]]) -> str:
    """The prompt text for ``(role, content)`` messages, with the generation prompt appended."""
    parts = [f"{IM_START}{role}\n{content}{IM_END}\n" for role, content in messages]
    parts.append(f"{IM_START}assistant\n")
    return "".join(parts)


def chat_prompt_ids(messages: Iterable[tuple[str, str]]) -> list[int]:
    """Prompt token ids of a conversation through the chat template."""
    return encode(render_chat(messages))


def block_hashes(token_ids: Sequence[int], block_size: int) -> tuple[int, ...]:
    """Chained hashes of the full ``block_size``-token blocks of ``token_ids``.

    Block ``i``'s hash covers the hash of block ``i - 1`` and its own tokens, so equal hashes
    mean equal prefixes, as in vLLM's prefix cache. A trailing partial block has no hash.
    """
    out: list[int] = []
    prev = b"\0" * 8
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        block = array("I", token_ids[start : start + block_size]).tobytes()
        prev = hashlib.blake2b(prev + block, digest_size=8).digest()
        out.append(int.from_bytes(prev, "big"))
    return tuple(out)


def digest(token_ids: Sequence[int], *salt: object) -> int:
    """A stable 64-bit digest of ``token_ids`` and ``salt`` (used to seed generation)."""
    h = hashlib.blake2b(array("I", token_ids).tobytes(), digest_size=8)
    h.update(repr(salt).encode())
    return int.from_bytes(h.digest(), "big")
