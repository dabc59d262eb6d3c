"""A paged KV block pool with prefix caching: GPU blocks pinned by running requests, free ones evicted
LRU, optionally to a CPU tier (a global prefix pool) that is itself LRU."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class CacheStats:
    allocated_blocks: int = 0
    evicted_blocks: int = 0
    cpu_hits: int = 0
    cpu_dropped: int = 0


class BlockPool:
    def __init__(self, gpu_blocks: int, cpu_blocks: int = 0, prefix_caching: bool = True):
        self.capacity = gpu_blocks
        self.cpu_capacity = cpu_blocks
        self.prefix_caching = prefix_caching
        self.refs: dict[int, int] = {}                 # cached GPU block -> running requests using it
        self.free_cached: OrderedDict[int, None] = OrderedDict()  # ref 0, evictable, LRU order
        self.private = 0                               # blocks of running requests with no identity
        self.cpu: OrderedDict[int, None] = OrderedDict()
        self.stats = CacheStats()

    @property
    def used(self) -> int:
        """GPU blocks holding KV (pinned, private, or cached and free)."""
        return len(self.refs) + self.private

    @property
    def available(self) -> int:
        return self.capacity - len(self.refs) - self.private + len(self.free_cached)

    def match(self, hashes: list[int]) -> tuple[int, int]:
        """(leading blocks found on the GPU, further leading blocks found in the CPU tier)."""
        if not self.prefix_caching:
            return 0, 0
        gpu = 0
        while gpu < len(hashes) and hashes[gpu] in self.refs:
            gpu += 1
        cpu = 0
        while gpu + cpu < len(hashes) and hashes[gpu + cpu] in self.cpu:
            cpu += 1
        return gpu, cpu

    def _evict_one(self) -> None:
        victim, _ = self.free_cached.popitem(last=False)
        del self.refs[victim]
        self.stats.evicted_blocks += 1
        if self.cpu_capacity:
            self.cpu[victim] = None
            self.cpu.move_to_end(victim)
            if len(self.cpu) > self.cpu_capacity:
                self.cpu.popitem(last=False)
                self.stats.cpu_dropped += 1

    def allocate(self, hashes: list[int], gpu_hits: int, cpu_loads: int, private_blocks: int) -> bool:
        """Pin the hit blocks, bring the CPU-tier loads back, and allocate the rest; False if it does not fit."""
        new_blocks = len(hashes) - gpu_hits + private_blocks
        hit_free = sum(1 for h in hashes[:gpu_hits] if self.refs[h] == 0)
        if new_blocks > self.available - hit_free:
            return False
        for h in hashes[:gpu_hits]:
            if self.refs[h] == 0:
                del self.free_cached[h]
            self.refs[h] += 1
        for h in hashes[gpu_hits:]:
            if h in self.refs:  # cached further along although an earlier block was evicted
                if self.refs[h] == 0:
                    del self.free_cached[h]
                self.refs[h] += 1
                continue
            while self.capacity - len(self.refs) - self.private < 1:
                self._evict_one()
            self.cpu.pop(h, None)
            self.refs[h] = 1
            self.stats.allocated_blocks += 1
        self.stats.cpu_hits += cpu_loads
        for _ in range(private_blocks):
            while self.capacity - len(self.refs) - self.private < 1:
                self._evict_one()
            self.private += 1
            self.stats.allocated_blocks += 1
        return True

    def release(self, hashes: list[int], private_blocks: int) -> None:
        """A request finished: its prompt blocks stay cached (evictable), its private blocks are freed."""
        for h in hashes:
            self.refs[h] -= 1
            if self.refs[h] == 0:
                if self.prefix_caching:
                    self.free_cached[h] = None
                    self.free_cached.move_to_end(h)
                else:
                    del self.refs[h]
        self.private -= private_blocks
