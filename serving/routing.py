"""Routing requests over data-parallel engine instances, chosen by name: pick(engines, seq, loads) -> engine."""
from __future__ import annotations

import itertools

# SGLang's model gateway (sgl-router, now SMG; lightseekorg/smg docs/getting-started/load-balancing.md), its
# cache_aware policy's defaults: a prefix match of at least this share of the prompt routes to its instance ...
CACHE_THRESHOLD = 0.3
# ... unless the loads (requests waiting or running) are out of balance: the most loaded instance holds more than
# BALANCE_ABS requests beyond the least loaded and BALANCE_REL times its load; then the least loaded takes it
BALANCE_ABS, BALANCE_REL = 64, 1.5


def _round_robin():
    counter = itertools.count()

    def pick(engines, seq, loads):
        return engines[next(counter) % len(engines)]
    return pick


def _cache_aware():
    def pick(engines, seq, loads):
        """`loads`: each instance's requests in flight (at its HTTP server, waiting or running), as the gateway
        counts the requests it sent and has not seen answered."""
        if max(loads) - min(loads) > BALANCE_ABS and max(loads) > min(loads) * BALANCE_REL:
            return min(engines, key=lambda e: (loads[e.index], e.index))
        # the longest prefix already on an instance's GPU; ties go to the least loaded, then the first
        hits = [e.cache.peek(seq) for e in engines]
        best = max(engines, key=lambda e: (hits[e.index], -loads[e.index], -e.index))
        if hits[best.index] >= CACHE_THRESHOLD * seq.req.prompt_tokens:
            return best
        # too little of the prompt cached anywhere: the instance with the most cache room (the gateway's smallest
        # tree: blocks held by requests or kept for reuse)
        return min(engines, key=lambda e: (e.cache.used_blocks + e.cache.evictable_blocks, loads[e.index], e.index))
    return pick


ROUTERS = {"round-robin": _round_robin, "cache-aware": _cache_aware}


def make_router(name: str):
    if name not in ROUTERS:
        raise ValueError(f"unknown routing '{name}' (choose from {', '.join(ROUTERS)})")
    return ROUTERS[name]()
