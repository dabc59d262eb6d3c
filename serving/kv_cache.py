"""Cache policies by name: each engine's prefix-cache rules live in one module."""
from __future__ import annotations

from .radix_cache import RadixCache
from .vllm_cache import VllmBlockCache

CACHE_POLICIES = {"vllm": VllmBlockCache, "sglang": RadixCache}


def make_cache(policy: str, gpu_blocks: int, block_size: int, prefix_caching: bool = True):
    if policy not in CACHE_POLICIES:
        raise ValueError(f"unknown cache policy '{policy}' (choose from {', '.join(CACHE_POLICIES)})")
    if not prefix_caching:  # no identities at all: every policy is the same plain block allocator
        return VllmBlockCache(gpu_blocks, block_size, prefix_caching=False)
    return CACHE_POLICIES[policy](gpu_blocks, block_size)
