"""Dense GEMM (x[m,k] @ W[n,k]^T) as a serving engine launches it, for each weight format.

The library picks a tile shape and a split of K per problem; tracecost takes the fastest of a fixed
set of tiles and splits, each priced as waves of CTAs over the compute units:

    CTA time  = K-steps x max(tile FLOPs / per-unit peak x efficiency(tile), K latency) + prologue/epilogue
    compute   = waves x CTA time, slowed past the boost window by the power limit
    memory    = bytes / (HBM bandwidth x efficiency); operands resident in L2 stream faster
    time      = soft_max(compute, memory) + split-K reduction + fixed cost per call

Weight formats with a dynamically quantized activation (fp8, fp8_block, nvfp4) add the quantization
kernel (`stream.quant_time`), as engines run it and as the kernel tables time it.

A call the host issues outside a CUDA graph takes at least the host's time to issue it (`host_issue_s`);
the GPU's work overlaps it, so a table row is soft_max(device time, host time) (`host_overlap`).
AIConfigurator 0.12's vLLM block-fp8 rows are such calls: 160-300 us on Blackwell (B200's x86 hosts ~165
us, GB200 / GB300's Grace ~290 us) for GEMMs of 3-30 us on the GPU, the same floor for every n and k. In a
model step the engine replays CUDA graphs (or runs ahead of the GPU), so that time is hidden, not priced
(`kernel_rows.gemm_rows_time(model_step=True)`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .common import Times, arrays, soft_max
from .params import ParamSet, param

# (tile_m, tile_n): Hopper/Blackwell/Ampere GEMM libraries pick among shapes like these; swapped
# shapes (16x128) are the small-M kernels that put M on the narrow side
TILES = np.array([(128, 256), (256, 128), (128, 128), (64, 256), (64, 128), (128, 64), (64, 64), (128, 32),
                  (128, 16), (32, 128), (16, 128)], dtype=float)
SPLITS = np.array([1, 2, 4, 8, 16], dtype=float)
K_STEP = 64
_REFERENCE_REUSE = 128 * 256 / (128 + 256)  # operand reuse of the largest tile
# vLLM's block-fp8 linear runs DeepGEMM where N % 64 == 0 and K % 128 == 0, CUTLASS otherwise
# (vllm/utils/deep_gemm.py should_use_deepgemm_for_fp8_linear; the tables' kernel_source column agrees
# on every row); DeepGEMM's fp32 activation scales are laid out with M padded to the TMA alignment of
# 16 bytes (get_tma_aligned_size), 4 rows
DEEPGEMM_N, DEEPGEMM_K, SCALE_ROW_ALIGN = 64, 128, 4


@dataclass(frozen=True)
class GemmParams(ParamSet):
    compute: float = param(0.85, 0.3, 1.0, "fraction of the matrix peak the largest tile reaches")
    tile_sensitivity: float = param(0.3, 0.0, 3.0, "efficiency loss of smaller tiles (less operand reuse)")
    k_latency_ns: float = param(1.5, 0.0, 10.0, "ns per K element of a CTA's main loop when latency-bound")
    cta_us: float = param(0.5, 0.0, 5.0, "prologue and epilogue of one wave of CTAs, us")
    fixed_us: float = param(2.2, 0.0, 150.0, "per call: launch (graph replay or eager) and tail, us")
    memory: float = param(0.85, 0.2, 1.0, "fraction of HBM bandwidth a streaming GEMM reaches")
    smoothness: float = param(2.5, 1.0, 10.0, "p of the soft max of compute and memory time")
    split_k_us: float = param(2.0, 0.0, 10.0, "extra cost of a split-K reduction, us")
    l2_speedup: float = param(2.0, 1.0, 8.0, "bandwidth of L2-resident operands over HBM")
    l2_fraction: float = param(0.57, 0.04, 1.0, "share of L2 that operands may fill and stay resident")
    l2_write_speedup: float = param(1.0, 1.0, 8.0, "bandwidth of output writes L2 absorbs (the output fits beside "
                                    "the activation: a benchmark rewrites the same buffer, and in a model step the "
                                    "next kernel reads it from there) over HBM's; 1: every write goes to HBM")
    sustained_slowdown: float = param(1.1, 1.0, 2.0, "compute slowdown past the boost window (power limit)")
    boost_us: float = param(2000.0, 10.0, 50000.0, "how long a kernel runs at boost clocks, us")
    row_ns: float = param(0.0, 0.0, 100.0, "per output row, serial (scale epilogues), ns")
    quant_passes: float = param(1.0, 0.0, 4.0, "activation quantization kernels per call (quantized formats)")
    host_us: float = param(0.0, 0.0, 1000.0, "host time to issue one call outside a CUDA graph (the engine's "
                           "Python op: dispatch, quantization and scale-layout launches), which the GPU's work "
                           "overlaps; hidden in a model step (CUDA graphs). 0: the tables time graph replays, us")
    host_unaligned_us: float = param(0.0, 0.0, 1000.0, "extra host time of a DeepGEMM call whose M is not a "
                                     "multiple of the scales' 4-row TMA alignment (the padded scale buffer "
                                     "and its copy), us")
    host_overlap: float = param(4.0, 1.0, 10.0, "p of the soft max of host and device time: how much of the "
                                "device's work hides under the host's (1: none, serial; large: all)")
    one_row_us: float = param(0.0, 0.0, 50.0, "extra device time of a call with one row (m = 1). vLLM's per-tensor "
                              "fp8 calls on Blackwell take ~13-15 us more at m = 1 than at m = 2, for every n and k "
                              "and on x86 and Grace hosts alike (so not the host); Hopper's and every bf16 call "
                              "take none. 0: no such path, us")


def host_issue_s(p: GemmParams, m, n, k) -> np.ndarray:
    """Seconds the host takes to issue one call outside a CUDA graph (0 where the tables time graphs)."""
    m, n, k = arrays(m, n, k)
    deepgemm = (n % DEEPGEMM_N == 0) & (k % DEEPGEMM_K == 0)
    unaligned = deepgemm & (m % SCALE_ROW_ALIGN != 0)
    return (p.host_us + unaligned * p.host_unaligned_us) * 1e-6


def gemm_time(p: GemmParams, compute_units: int, peak_flops: float, bandwidth: float, l2_bytes: float,
              m, n, k, act_bytes: float = 2.0, weight_bytes: float = 2.0, out_bytes: float = 2.0,
              resident_weight_copies: float = 0.0) -> Times:
    """Time of x[m,k] @ W[n,k]^T. `resident_weight_copies` > 0: a benchmark cycling that many weight copies,
    which stay in L2 when they fit; 0: weights stream from HBM, as every layer's do in a model step."""
    m, n, k, copies = arrays(m, n, k, resident_weight_copies)
    shape = np.broadcast_shapes(m.shape, n.shape, k.shape, copies.shape)
    m, n, k, copies = (np.broadcast_to(a, shape)[..., None, None] for a in (m, n, k, copies))
    tile_m, tile_n = TILES[:, 0][:, None], TILES[:, 1][:, None]
    splits = SPLITS[None, :]

    # memory: the activation stays in L2 when it fits (the kernel that produced it just wrote it)
    x_bytes, w_bytes, o_bytes = m * k * act_bytes, n * k * weight_bytes, m * n * out_bytes
    capacity = l2_bytes * p.l2_fraction
    x_hot = x_bytes <= capacity
    w_hot = (copies > 0) & (x_bytes + copies * w_bytes <= capacity)
    o_hot = x_bytes + o_bytes <= capacity
    streamed = (np.where(x_hot, x_bytes / p.l2_speedup, x_bytes) + np.where(w_hot, w_bytes / p.l2_speedup, w_bytes)
                + np.where(o_hot, o_bytes / p.l2_write_speedup, o_bytes) + (splits > 1) * m * n * 4.0 * splits * 2.0)
    memory = streamed / (bandwidth * p.memory)

    reuse = tile_m * tile_n / (tile_m + tile_n)
    efficiency = p.compute / (1.0 + p.tile_sensitivity * (_REFERENCE_REUSE / reuse - 1.0))
    tiles = np.ceil(m / tile_m) * np.ceil(n / tile_n)
    k_per_cta = np.ceil(np.ceil(k / splits) / K_STEP) * K_STEP
    waves = np.ceil(tiles * splits / compute_units)
    per_k = np.maximum(2.0 * tile_m * tile_n / (peak_flops / compute_units * efficiency), p.k_latency_ns * 1e-9)
    compute = waves * (k_per_cta * per_k + p.cta_us * 1e-6)
    boost = p.boost_us * 1e-6
    compute = np.minimum(compute, boost) + np.maximum(compute - boost, 0.0) * p.sustained_slowdown

    fixed = p.fixed_us * 1e-6 + (splits > 1) * p.split_k_us * 1e-6 + m * p.row_ns * 1e-9 \
        + (m == 1) * p.one_row_us * 1e-6
    total = soft_max(compute, memory, p.smoothness) + fixed
    total = np.where((splits > 1) & (k / splits < K_STEP), np.inf, total)  # no split below one K step
    flat = total.reshape(*shape, -1)
    best = np.argmin(flat, axis=-1)[..., None]
    pick = lambda a: np.take_along_axis(np.broadcast_to(a, total.shape).reshape(*shape, -1), best, -1)[..., 0]  # noqa: E731
    return Times(pick(total), pick(compute), pick(memory), pick(np.broadcast_to(fixed, total.shape)))
