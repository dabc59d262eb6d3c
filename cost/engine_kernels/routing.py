"""How many (token, expert) pairs land on one rank's experts, and how they pad the grouped GEMM tiles.

Three routings: `random` (each token picks its k experts uniformly: the expectation a model step is
priced with), `balanced` (every expert gets the same share, as a balanced benchmark router does), and
`power_law_<alpha>` (expert loads drawn from a power law, the most loaded EP rank measured, as the
AIConfigurator collectors generate it). The power law is averaged over a few seeded draws, so a
result is deterministic.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

BLOCK_M = (16, 32, 64, 128)   # grouped-GEMM row tiles the kernels choose among
_DRAWS = 8


@dataclass(frozen=True)
class RoutingStats:
    pairs: float                      # (token, expert) pairs computed on this rank
    active_experts: float             # local experts with at least one token
    padded_tiles: tuple[float, ...]   # sum over local experts of ceil(tokens / BLOCK_M[i])


def _stats(counts: np.ndarray) -> RoutingStats:
    counts = np.asarray(counts, dtype=float)
    return RoutingStats(float(counts.sum()), float((counts > 0).sum()),
                        tuple(float(np.ceil(counts / bm).sum()) for bm in BLOCK_M))


def balanced(tokens: int, experts: int, top_k: int, ep: int = 1) -> RoutingStats:
    pairs = tokens * top_k
    counts = np.full(experts, pairs // experts, dtype=float)
    counts[: pairs % experts] += 1
    return _stats(counts[: experts // ep])


def random_uniform(tokens: int, experts: int, top_k: int, ep: int = 1, imbalance: float = 1.0) -> RoutingStats:
    """Expected statistics when every token picks top_k distinct experts uniformly at random. `imbalance`: every
    local expert takes that many times its share (at most every token), as the busiest expert of a skewed routing
    does: the pessimistic reading of --moe-imbalance, the busiest expert setting the pace."""
    local = experts // ep
    p_hit = min(1.0, top_k / experts)
    mean = min(float(tokens), tokens * p_hit * imbalance)
    active = local * (1.0 - (1.0 - p_hit) ** tokens)
    # an active expert needs at least one tile and pads its last one by about half a tile
    p_active = active / local
    tiles = tuple(local * max(p_active, (mean + p_active * (bm - 1) / 2) / bm) for bm in BLOCK_M)
    return RoutingStats(local * mean, active, tiles)


def _power_law_draw(rng: np.random.Generator, tokens: int, experts: int, top_k: int, alpha: float) -> np.ndarray:
    xmin, xmax = (1.0, tokens * 0.8) if tokens * top_k > experts else (0.01, 2.0)
    u = rng.random(experts)
    x = ((xmax ** (1 - alpha) - xmin ** (1 - alpha)) * u + xmin ** (1 - alpha)) ** (1 / (1 - alpha))
    target = tokens * top_k
    counts = np.minimum(np.round(x / x.sum() * target), tokens)  # an expert takes each token at most once
    while (diff := target - counts.sum()) != 0:  # rounding and clamping moved the total: even it out
        if diff > 0:
            room = np.flatnonzero(counts < tokens)
            counts[room[np.argsort(counts[room], kind="stable")][: int(min(diff, room.size))]] += 1
        else:
            held = np.flatnonzero(counts > 0)
            counts[held[np.argsort(-counts[held], kind="stable")][: int(min(-diff, held.size))]] -= 1
    return counts


@lru_cache(maxsize=4096)
def power_law(tokens: int, experts: int, top_k: int, ep: int, alpha: float) -> RoutingStats:
    rng = np.random.default_rng(1234)
    local = experts // ep
    draws = []
    for _ in range(_DRAWS):
        counts = _power_law_draw(rng, tokens, experts, top_k, alpha)
        by_rank = counts.reshape(ep, local)
        draws.append(_stats(by_rank[int(by_rank.sum(axis=1).argmax())]))  # the most loaded rank is timed
    return RoutingStats(float(np.mean([d.pairs for d in draws])), float(np.mean([d.active_experts for d in draws])),
                        tuple(float(np.mean([d.padded_tiles[i] for d in draws])) for i in range(len(BLOCK_M))))


ROUTINGS = ("random", "balanced", "power_law_1.01", "power_law_1.2")


def routing_stats(routing: str, tokens: int, experts: int, top_k: int, ep: int = 1,
                  imbalance: float = 1.0) -> RoutingStats:
    if routing == "random":
        return random_uniform(tokens, experts, top_k, ep, imbalance)
    if imbalance != 1.0:
        raise ValueError(f"routing '{routing}' draws its own loads: an imbalance factor applies to random routing")
    if routing == "balanced":
        return balanced(tokens, experts, top_k, ep)
    if routing.startswith("power_law_"):
        try:
            alpha = float(routing.removeprefix("power_law_"))
        except ValueError:
            alpha = float("nan")
        if not (alpha > 1.0 and math.isfinite(alpha)):
            raise ValueError(f"routing '{routing}': the power-law exponent must be a number > 1")
        return power_law(tokens, experts, top_k, ep, alpha)
    raise ValueError(f"unknown routing '{routing}' (choose from random, balanced, power_law_<alpha>)")
