"""Routing requests over data-parallel engine instances, chosen by name."""
from __future__ import annotations

import itertools


def _round_robin():
    counter = itertools.count()

    def pick(engines, seq):
        return engines[next(counter) % len(engines)]
    return pick


def _cache_aware():
    def pick(engines, seq):
        # the longest prefix already on an instance's GPU; ties go to the least loaded, then the first
        return max(engines, key=lambda e: (e.cache.peek(seq), -e.load, -e.index))
    return pick


ROUTERS = {"round-robin": _round_robin, "cache-aware": _cache_aware}


def make_router(name: str):
    if name not in ROUTERS:
        raise ValueError(f"unknown routing '{name}' (choose from {', '.join(ROUTERS)})")
    return ROUTERS[name]()
