"""Time of one kernel on one device: a roofline per kernel with shape-dependent efficiency.

Every model is `max(compute, memory) + fixed latency`, where compute and memory are datasheet
peaks times a fitted fraction, and the shape enters through how well the work fills the chip:
GEMM tiles and waves over the compute units, and for flash attention the causal work of each
query tile and the longest one (a CTA cannot be split across units).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from tracer.work import AttentionWork, ExpertsWork, GemmShape

from .profile import HardwareProfile

COMPUTE, MEMORY, OVERHEAD = "compute", "memory", "overhead"


@dataclass(frozen=True)
class KernelTime:
    seconds: float
    compute_s: float
    memory_s: float
    fixed_s: float

    @property
    def bound(self) -> str:
        if self.fixed_s >= max(self.compute_s, self.memory_s):
            return OVERHEAD
        return COMPUTE if self.compute_s >= self.memory_s else MEMORY


def _soft_max(a: float, b: float, p: float) -> float:
    if a <= 0 or b <= 0:
        return max(a, b)
    hi = max(a, b)
    return hi * ((a / hi) ** p + (b / hi) ** p) ** (1.0 / p)


def _tile_fill(shape: GemmShape, compute_units: int, tile_m: int, tile_n: int) -> float:
    tm = min(tile_m, max(16, 1 << max(0, math.ceil(math.log2(max(1, shape.m))))))
    tiles_m, tiles_n = math.ceil(shape.m / tm), math.ceil(shape.n / tile_n)
    padding = (shape.m * shape.n) / (tiles_m * tm * tiles_n * tile_n)
    tiles = tiles_m * tiles_n * shape.batch
    # fewer tiles than units: the library splits K to fill the chip
    waves = tiles / (math.ceil(tiles / compute_units) * compute_units) if tiles >= compute_units else 1.0
    return padding * waves


def gemm_fill(shape: GemmShape, compute_units: int, tile_m: int, tile_n: int) -> float:
    """Fraction of the matrix units a GEMM keeps busy: last-tile padding and wave quantization, for the
    best of the profile's tile and its halves (GEMM libraries pick the tile per shape)."""
    candidates = {(tile_m, tile_n), (tile_m, tile_n // 2), (tile_m // 2, tile_n // 2), (tile_n, tile_m // 2)}
    return max(_tile_fill(shape, compute_units, tm, tn) for tm, tn in candidates if tm >= 16 and tn >= 16)


def gemm_time(flops: float, nbytes: float, shape: GemmShape | None, dtype: str, hw: HardwareProfile,
              grouped: bool = False) -> KernelTime:
    eff = hw.efficiency.grouped_gemm if grouped else hw.efficiency.gemm
    fill = gemm_fill(shape, hw.compute_units, eff.tile_m, eff.tile_n) if shape else 1.0
    compute = flops / (hw.matrix_peak(dtype) * eff.compute * fill)
    memory = nbytes / (hw.bandwidth * eff.memory)
    fixed = eff.fixed_us * 1e-6
    return KernelTime(_soft_max(compute, memory, eff.smoothness) + fixed, compute, memory, fixed)


def experts_time(flops: float, nbytes: float, w: ExpertsWork, dtype: str, hw: HardwareProfile) -> KernelTime:
    """Grouped expert GEMMs: each active expert is a GEMM of tokens_per_expert rows."""
    rows = max(1, round(w.tokens_per_expert))
    experts = max(1, round(w.active_experts))
    # the busiest expert sets the pace when routing is imbalanced
    flops = flops * w.imbalance if w.imbalance > 1 else flops
    shape = GemmShape(m=rows, n=w.up_width + w.hidden_size, k=w.hidden_size, batch=experts)
    t = gemm_time(flops, nbytes, shape, dtype, hw, grouped=True)
    per_group = hw.efficiency.grouped_gemm.per_group_us * 1e-6 * w.active_experts
    return KernelTime(t.seconds + per_group, t.compute_s, t.memory_s, t.fixed_s + per_group)


def flash_tiles(w: AttentionWork, tile_q: int, tile_k: int, full_rectangle: bool = False) -> tuple[float, int]:
    """(key tiles summed over all query-tile CTAs of one (sequence, head), key tiles of the longest CTA).

    Causal kernels skip tiles above the diagonal; a kernel fed an explicit bias tensor cannot know
    which tiles are masked and computes the full query x key rectangle."""
    q, c = w.query_length, w.context_length
    total, longest = 0.0, 0
    n_q = math.ceil(q / tile_q)
    for i in range(n_q):
        last_key = c + (q if full_rectangle else min(q, (i + 1) * tile_q))  # causal: keys up to the tile's last query
        first_key = 0 if w.window is None else max(0, c + i * tile_q - w.window + 1)
        tiles = math.ceil((last_key - first_key) / tile_k)
        total += tiles
        longest = max(longest, tiles)
    return total, longest


def attention_time(flops: float, nbytes: float, w: AttentionWork, dtype: str, hw: HardwareProfile,
                   masked: bool = False) -> KernelTime:
    eff = hw.efficiency.attention
    fixed = eff.fixed_us * 1e-6
    memory = nbytes / (hw.bandwidth * eff.memory)
    efficiency = eff.masked_compute if masked else eff.compute
    if w.query_length == 1:
        compute = flops / (hw.matrix_peak(dtype) * efficiency)
    else:
        tile_q, tile_k = (eff.masked_tile_q, eff.masked_tile_k) if masked else (eff.tile_q, eff.tile_k)
        per_head, longest = flash_tiles(w, tile_q, tile_k, full_rectangle=masked)
        ctas = math.ceil(w.query_length / tile_q) * w.batch * w.heads
        # a CTA's keys cannot spread over units, except that with fewer CTAs than units the keys are split
        split = max(1, hw.compute_units // ctas)
        makespan = max(per_head * w.batch * w.heads / hw.compute_units, longest / split)
        tile_flops = 2.0 * tile_q * tile_k * (w.qk_head_dim + w.v_head_dim)
        per_unit_matrix = hw.matrix_peak(dtype) / hw.compute_units * efficiency
        per_unit_vector = hw.vector_peak("fp32") / hw.compute_units
        tile_seconds = tile_flops / per_unit_matrix + tile_q * tile_k * eff.softmax_ops / per_unit_vector
        compute = makespan * tile_seconds
    return KernelTime(max(compute, memory) + fixed, compute, memory, fixed)


def stream_time(flops: float, nbytes: float, dtype: str, hw: HardwareProfile, broadcast: bool = False) -> KernelTime:
    eff = hw.efficiency.elementwise
    memory = nbytes / (hw.bandwidth * (eff.broadcast_memory if broadcast else eff.memory))
    compute = flops / hw.vector_peak(dtype if dtype in hw.vector_tflops else "fp32")
    fixed = eff.fixed_us * 1e-6
    return KernelTime(max(compute, memory) + fixed, compute, memory, fixed)
