"""KV-cache blocks and the prefix cache over them (pure, like vLLM's block pool).

The cache is ``num_blocks`` fixed-size blocks. A block in use by a running sequence has a
reference count above zero and is never evicted. A released block keeps its contents and its
hash: it joins the free queue, where a later request with the same prefix can take it back, until
an allocation needs it and evicts it, least recently released first (LRU). A sequence releases
its blocks last-first, so the tail of a prompt is evicted before its shared head.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from functools import partial
from itertools import takewhile
from operator import is_not

_IS_BLOCK = partial(is_not, None)
"""``_IS_BLOCK(x)`` is ``x is not None``, callable from C."""


class BlockPool:
    """``num_blocks`` KV-cache blocks with a prefix cache keyed by chained block hashes."""

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self._refs = [0] * num_blocks
        self._hash_of: list[int | None] = [None] * num_blocks
        self._by_hash: dict[int, int] = {}
        # The free queue, front first: empty blocks (no hash: worth nothing, handed out first,
        # the most recently released first) as a stack whose top is its end, then the cached
        # ones, least recently released first. An allocation takes from the front.
        self._empty: list[int] = list(range(num_blocks - 1, -1, -1))
        self._cached: OrderedDict[int, None] = OrderedDict()

    @property
    def num_free(self) -> int:
        """Blocks no running sequence uses (cached or empty)."""
        return len(self._empty) + len(self._cached)

    @property
    def usage(self) -> float:
        """Share (0..1) of blocks in use by sequences, as vLLM's ``kv_cache_usage_perc``."""
        return 1.0 - (len(self._empty) + len(self._cached)) / self.num_blocks

    @property
    def num_cached(self) -> int:
        """Blocks that hold a registered prefix (in use or free)."""
        return len(self._by_hash)

    def cached_prefix(self, hashes: Sequence[int]) -> list[int]:
        """Block ids holding the longest run of leading ``hashes`` that is cached."""
        if not self.enable_caching:
            return []
        # map / takewhile run in C: a lookup per hash until the first miss
        found: Iterator[int] = takewhile(_IS_BLOCK, map(self._by_hash.get, hashes))  # type: ignore[arg-type]
        return list(found)

    def count_free(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` sit in the free queue (taking them shrinks it)."""
        return list(map(self._refs.__getitem__, blocks)).count(0)

    def acquire(self, blocks: Sequence[int]) -> None:
        """Take a reference on cached ``blocks`` (a prefix hit)."""
        refs, cached = self._refs, self._cached
        for b in blocks:
            r = refs[b]
            if not r:
                del cached[b]  # a hit holds a hash: a free one sits in the cached queue
            refs[b] = r + 1

    def allocate(self, n: int) -> list[int]:
        """``n`` fresh blocks, evicting the least recently released cached ones."""
        empty = self._empty
        if n > len(empty) + len(self._cached):
            raise ValueError(f"cannot allocate {n} blocks, {self.num_free} free")
        refs = self._refs
        if n <= len(empty):
            out = empty[-n:] if n else []
            del empty[len(empty) - n:]
            out.reverse()
        else:
            out = empty[::-1]
            empty.clear()
            popitem, hash_of, by_hash = self._cached.popitem, self._hash_of, self._by_hash
            for _ in range(n - len(out)):
                b, _none = popitem(False)
                del by_hash[hash_of[b]]  # type: ignore[arg-type]  # a cached block has a hash
                hash_of[b] = None
                out.append(b)
        for b in out:
            refs[b] = 1
        return out

    def allocate_one(self) -> int:
        """One fresh block (``allocate(1)`` without the list), for a sequence's next block."""
        if self._empty:
            b = self._empty.pop()
        elif self._cached:
            b, _none = self._cached.popitem(last=False)
            del self._by_hash[self._hash_of[b]]  # type: ignore[arg-type]  # a cached block has a hash
            self._hash_of[b] = None
        else:
            raise ValueError("cannot allocate a block, none free")
        self._refs[b] = 1
        return b

    def register_run(self, blocks: Sequence[int], hashes: Sequence[int], start: int, stop: int) -> None:
        """``register(blocks[i], hashes[i])`` for ``i`` in ``range(start, stop)``, in order."""
        if not self.enable_caching:
            return
        hash_of, by_hash = self._hash_of, self._by_hash
        for i in range(start, stop):
            block, h = blocks[i], hashes[i]
            if hash_of[block] is None and h not in by_hash:
                hash_of[block] = h
                by_hash[h] = block

    def register(self, block: int, block_hash: int) -> None:
        """Record that full ``block`` holds the prefix ending in ``block_hash``."""
        if not self.enable_caching or self._hash_of[block] is not None or block_hash in self._by_hash:
            return
        self._hash_of[block] = block_hash
        self._by_hash[block_hash] = block

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference on each of ``blocks``, last block first."""
        refs, hash_of, cached, empty = self._refs, self._hash_of, self._cached, self._empty
        for b in reversed(blocks):
            r = refs[b] - 1
            refs[b] = r
            if not r:
                if hash_of[b] is None:
                    empty.append(b)  # an empty block is worth nothing: handed out before any cached one
                else:
                    cached[b] = None
