"""A fused-MoE layer as the engines run it: routing (top-k), permutation into per-expert groups, the
gate/up and down grouped GEMMs with the activation between them, and the weighted combine.

Under tensor parallelism each rank holds every expert's 1/tp slice; under expert parallelism each rank
holds E/ep whole experts. In vLLM's default EP every token passes through every rank's routing and
permutation, and only the pairs routed to local experts reach the GEMMs (`tokens` = all tokens on the
rank). Dispatch-style EP (DeepEP) sends each rank only its pairs: the caller passes those tokens.

    GEMMs   = for the best row tile: waves of (padded expert rows x output tiles) x tile time (tiles of experts
              wider than 4096 run slower, by a fitted share per doubling: B200's Triton kernels)
    memory  = active experts' weights + activations, over HBM bandwidth (at its own rate once the kernel takes
              its large-row-tile configuration: past a number of rows per active expert, or, for a kernel on its
              default configuration, past as many tokens as the rank has experts; its GEMMs at their own rate too)
    time    = fixed + tokens x token latency + pairs x pair latency + active experts x expert latency
              + soft_max(GEMMs, memory)   (x `ungated` for a non-gated layer an engine runs on another kernel)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .common import Times, arrays, soft_max
from .params import ParamSet, param
from .routing import BLOCK_M

BLOCK_N = 128.0
_REFERENCE_REUSE = 128 * 128 / (128 + 128)


@dataclass(frozen=True)
class MoeParams(ParamSet):
    compute: float = param(0.7, 0.05, 1.0, "fraction of the matrix peak of the largest row tile")
    tile_sensitivity: float = param(0.3, 0.0, 3.0, "efficiency loss of smaller row tiles")
    wide_expert: float = param(0.0, 0.0, 2.0, "efficiency loss per doubling of the local expert width beyond "
                               "4096 (long down-projection K loops; B200's Triton kernels)", starts=(0.4,))
    k_latency_ns: float = param(1.0, 0.0, 20.0, "ns per K element of one tile's loop when latency-bound")
    memory: float = param(0.8, 0.05, 1.0, "fraction of HBM bandwidth streaming expert weights")
    large_tile_memory: float = param(1.0, 0.05, 1.0, "the streaming rate, relative to `memory`, once the kernel "
                                     "takes its large-row-tile configuration (tuned per row count)")
    large_tile_rows: float = param(8.0, 1.0, 256.0, "rows per active expert beyond which it does",
                                   grid=(8.0, 32.0))
    # A shape without a tuned config file runs the Triton kernel's default configuration, which changes once the
    # tokens outnumber the rank's experts (SGLang's get_default_config, adapted from vLLM's: 16 x 32 x 64 tiles for
    # M <= E, 64 x 64 x 32 beyond), whatever each expert's rows; 0 keeps the rows-per-active-expert switch. A shape
    # with a tuned configuration file (tuned_moe.py) switches at large_tile_rows either way
    large_tile_tokens: float = param(0.0, 0.0, 1.0, "1: the switch is at more tokens than local experts (the "
                                     "kernel's default configuration); 0: at large_tile_rows", grid=(0.0, 1.0))
    large_tile_compute: float = param(1.0, 0.2, 1.0, "the matrix rate, relative to `compute`, of the default "
                                      "configuration's large tiles (64 x 64 x 32)")
    fixed_us: float = param(20.0, 0.0, 200.0, "per layer call: the kernels' launches and tails, us")
    token_ns: float = param(5.0, 0.0, 500.0, "routing and permutation per token, ns")
    pair_ns: float = param(1.0, 0.0, 200.0, "alignment and combine per (token, expert) pair, ns")
    expert_us: float = param(0.3, 0.0, 20.0, "per active local expert (group scheduling), us")
    smoothness: float = param(2.0, 1.0, 10.0, "p of the soft max of GEMM and memory time")
    ungated: float = param(1.0, 0.2, 5.0, "time of a non-gated (relu^2) layer relative to the model's: engines may "
                           "run it through another kernel (SGLang's generic fused-MoE layer)")


def moe_time(p: MoeParams, compute_units: int, peak_flops: float, bandwidth: float, tokens, hidden, inter_local,
             top_k, pairs_local, active_local, padded_tiles, gated=True, weight_bytes: float = 2.0,
             act_bytes: float = 2.0, local_experts=None, tuned=False) -> Times:
    """`padded_tiles[..., i]`: sum over local experts of ceil(rows / BLOCK_M[i]) (routing.RoutingStats);
    `local_experts`: the experts the rank holds (E / ep), where the default configuration switches (None: the
    active ones); `tuned`: the engine ships a tuned configuration for the shape (tuned_moe.py), which it runs
    instead of the default one."""
    t, h, i_l, k, pairs, active = arrays(tokens, hidden, inter_local, top_k, pairs_local, active_local)
    up = np.where(gated, 2.0, 1.0) * i_l
    wide = 1.0 + p.wide_expert * np.maximum(0.0, np.log2(np.maximum(i_l, 1.0) / 4096.0))
    if local_experts is None:
        local_experts = np.maximum(active, 1.0)
    default = (p.large_tile_tokens >= 0.5) & ~np.asarray(tuned, dtype=bool)
    large = np.where(default, t > np.asarray(local_experts, dtype=float),
                     pairs / np.maximum(active, 1.0) > p.large_tile_rows)
    best = None
    for j, block_m in enumerate(BLOCK_M):
        rows = np.asarray(padded_tiles, dtype=float)[..., j]
        reuse = block_m * BLOCK_N / (block_m + BLOCK_N)
        efficiency = p.compute / ((1.0 + p.tile_sensitivity * (_REFERENCE_REUSE / reuse - 1.0)) * wide)
        per_k = np.maximum(2.0 * block_m * BLOCK_N / (peak_flops / compute_units * efficiency), p.k_latency_ns * 1e-9)
        gemms = 0.0
        for n_out, k_in in ((up, h), (h, i_l)):
            tiles = rows * np.ceil(n_out / BLOCK_N)
            gemms = gemms + np.ceil(tiles / compute_units) * k_in * per_k
        best = gemms if best is None else np.minimum(best, gemms)
    best = best / np.where(large & default, p.large_tile_compute, 1.0)
    weights = active * (up * h + h * i_l) * weight_bytes
    activations = (t * h + pairs * (h + up + i_l + h)) * act_bytes
    memory = (weights + activations) / (bandwidth * p.memory * np.where(large, p.large_tile_memory, 1.0))
    fixed = (p.fixed_us * 1e-6 + t * p.token_ns * 1e-9 + t * k * p.pair_ns * 1e-9 + active * p.expert_us * 1e-6)
    kernel = np.where(gated, 1.0, p.ungated)
    return Times(fixed + kernel * soft_max(best, memory, p.smoothness), best, memory, fixed)
