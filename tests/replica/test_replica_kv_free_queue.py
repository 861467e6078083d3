"""The KV block pool's free queue against the one-queue definition it replaced: the same blocks
allocated (and so the same prefixes evicted) under random prefix hits, allocations, block
registrations and releases, with and without prefix caching."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from replica.kv_cache import BlockPool


class _OneQueuePool:
    """The definition: one ordered free queue; a released empty block goes to its front, a
    released cached one to its back; allocations take from the front."""

    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        self.enable_caching = enable_caching
        self.refs = [0] * num_blocks
        self.hash_of: list[int | None] = [None] * num_blocks
        self.by_hash: dict[int, int] = {}
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))

    def cached_prefix(self, hashes: list[int]) -> list[int]:
        out: list[int] = []
        for h in hashes if self.enable_caching else []:
            if h not in self.by_hash:
                break
            out.append(self.by_hash[h])
        return out

    def acquire(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.refs[b] == 0:
                del self.free[b]
            self.refs[b] += 1

    def allocate(self, n: int) -> list[int]:
        out = []
        for _ in range(n):
            b, _none = self.free.popitem(False)
            h = self.hash_of[b]
            if h is not None:
                del self.by_hash[h]
                self.hash_of[b] = None
            self.refs[b] = 1
            out.append(b)
        return out

    def register(self, block: int, h: int) -> None:
        if self.enable_caching and self.hash_of[block] is None and h not in self.by_hash:
            self.hash_of[block], self.by_hash[h] = h, block

    def release(self, blocks: list[int]) -> None:
        for b in reversed(blocks):
            self.refs[b] -= 1
            if not self.refs[b]:
                self.free[b] = None
                if self.hash_of[b] is None:
                    self.free.move_to_end(b, False)


@pytest.mark.parametrize("seed", range(12))
def test_allocations_match_the_one_queue_definition(seed: int) -> None:
    rng = random.Random(seed)
    num_blocks, caching = rng.choice([8, 32, 100]), seed % 4 != 0
    pool, ref = BlockPool(num_blocks, caching), _OneQueuePool(num_blocks, caching)
    prefixes = [[rng.randrange(1 << 40) for _ in range(12)] for _ in range(4)]
    held: list[list[int]] = []
    for _ in range(400):
        if held and (rng.random() < 0.4 or pool.num_free < 4):
            blocks = held.pop(rng.randrange(len(held)))
            pool.release(blocks)
            ref.release(blocks)
        else:
            prefix = rng.choice(prefixes)
            hashes = [*prefix[: rng.randrange(1, len(prefix))], rng.randrange(1 << 40)]
            hits = pool.cached_prefix(hashes)
            assert hits == ref.cached_prefix(hashes)
            need = min(len(hashes) - len(hits), pool.num_free - pool.count_free(hits))
            pool.acquire(hits)
            ref.acquire(hits)
            fresh = [pool.allocate_one()] if need == 1 and rng.random() < 0.5 else pool.allocate(need)
            assert fresh == ref.allocate(need)
            blocks = hits + fresh
            for i in range(len(hits), len(blocks)):
                pool.register(blocks[i], hashes[i])
                ref.register(blocks[i], hashes[i])
            held.append(blocks)
        assert pool.num_free == len(ref.free)
        assert pool.num_cached == len(ref.by_hash)
