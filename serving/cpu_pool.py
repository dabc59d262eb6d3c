"""Seed 004's global prefix pool: KV blocks in CPU memory, shared by every engine instance, LRU.

Blocks are written through when a request's prefill is done (its full prompt blocks), so a block evicted
from a GPU later is still found here; a full pool drops its least recently used block.
"""
from __future__ import annotations

from collections import OrderedDict


class CpuPool:
    def __init__(self, capacity_blocks: int):
        self.capacity = capacity_blocks
        self.blocks: OrderedDict[int, None] = OrderedDict()
        self.stored_blocks = 0
        self.dropped_blocks = 0

    def __len__(self) -> int:
        return len(self.blocks)

    def match(self, hashes, start: int, stop: int) -> int:
        """Consecutive blocks hashes[start:stop] found here."""
        n = start
        while n < stop and hashes[n] in self.blocks:
            n += 1
        return n - start

    def touch(self, hashes) -> None:
        for h in hashes:
            self.blocks.move_to_end(h)

    def store(self, hashes) -> int:
        """Write blocks through; returns how many were new (the ones copied over the host link)."""
        new, blocks = 0, self.blocks
        for h in hashes:
            if h in blocks:
                blocks.move_to_end(h)
                continue
            blocks[h] = None
            new += 1
            if len(blocks) > self.capacity:
                blocks.popitem(last=False)
                self.dropped_blocks += 1
        self.stored_blocks += new
        return new
