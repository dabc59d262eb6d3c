"""Paged flash attention as serving engines run it (FlashAttention-3 / FlashInfer / TRT-LLM kernels).

Each timed call also writes the new tokens' K/V into the paged cache, as the engines' attention
layers do, so a model step prices no separate KV-write kernel.

Prefill: CTAs of `tile_q` query rows (the query heads of one KV head share CTAs when that takes fewer
tiles: GQA packing) each sweep their causal key tiles; tiles spread over the compute units,
and every wave of CTAs pays a fixed prologue/epilogue:

    compute = max(total tiles / units, longest CTA) x tile time + waves x CTA latency
    time    = fixed + soft_max(compute, bytes / bandwidth) + KV-cache write

(the write of the new K/V into the paged cache is a kernel of its own, run before attention: it adds;
the share of the fresh Q, K, V and O that fits in L2 streams from it, `l2_speedup` times faster; `fixed`
adds, on some engines, a strided-layout cost once both the batch and the KV heads exceed one)

Decode: one CTA per (sequence, KV head), its keys split over more CTAs when the batch is small:

    time = fixed + soft_max(waves x CTA latency, KV bytes / (bandwidth x parallelism))

(`fixed` adds the combine kernel when keys are split, and on some engines a strided-layout cost once both
the batch and the KV heads exceed one)

Each KV-cache format has its own fitted parameters (engines run different kernels for fp8 KV, and
Hopper's dequantize on the fly, streaming fp8 bytes far below the bf16 rate: halving the bytes does
not halve the time).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .common import Times, arrays, soft_max
from .params import ParamSet, param


@dataclass(frozen=True)
class PrefillAttentionParams(ParamSet):
    fixed_us: float = param(10.0, 0.0, 60.0, "per call, KV-cache write included, us")
    strided_us: float = param(0.0, 0.0, 30.0, "per call once both the batch and the KV heads exceed one (a strided "
                              "K/V layout the kernel copies first; A100 and L40S engines), us")
    cta_us: float = param(3.0, 0.0, 60.0, "per wave of CTAs: load Q, page table, epilogue, us")
    cta_head_dim_us: float = param(0.5, 0.0, 60.0, "CTA latency growing with head dim (per 128), us")
    compute: float = param(0.7, 0.05, 1.0, "fraction of the matrix peak per busy unit, head dim 128")
    head_dim_64: float = param(1.0, 0.1, 2.0, "efficiency at head dim 64 relative to 128 (its own kernel instance)")
    head_dim_192: float = param(1.0, 0.1, 2.0, "efficiency at head dim 192 relative to 128")
    head_dim_256: float = param(1.0, 0.1, 2.0, "efficiency at head dim 256 relative to 128")
    head_dim_512: float = param(1.0, 0.02, 2.0, "efficiency at head dim 512 and above relative to 128 "
                                "(FlashAttention-3 stops at head dim 256: the engines run another kernel there, "
                                "0.2-0.7 of the rate)")
    softmax_ops: float = param(12.0, 0.0, 64.0, "vector ops per score (exp, max, sum, scale)")
    occupancy: float = param(2.0, 0.5, 8.0, "CTAs resident per unit")
    memory: float = param(0.8, 0.05, 1.0, "fraction of HBM bandwidth for Q, O and cached-prefix traffic")
    smoothness: float = param(2.0, 1.0, 10.0, "p of the soft max of compute and memory time", starts=(4.0,))
    write_memory: float = param(0.5, 0.01, 1.0, "fraction of HBM bandwidth writing new K/V into the paged cache")
    write_token_ns: float = param(1.0, 0.0, 200.0, "paged-cache write per (token, KV head), ns")
    write_row_ns: float = param(0.0, 0.0, 200.0, "paged-cache write per token, all its KV heads (the write kernel "
                                "takes a CTA per token: latency-bound when a token's K/V are few bytes), ns")
    kv_load: float = param(2.0, 0.05, 20.0, "bandwidth of the CTAs' K/V tile loads (mostly L2 hits) over HBM's")
    pack_gqa: float = param(0.0, 0.0, 1.0, "1: the kernel packs a KV head's query heads whenever that takes fewer "
                            "tiles (FlashAttention-3's rule); 0: only when they fit one tile", grid=(0.0, 1.0))
    l2_speedup: float = param(1.0, 1.0, 8.0, "bandwidth of L2-resident fresh Q/K/V/O over HBM's")
    l2_fraction: float = param(0.57, 0.04, 1.0, "share of L2 the fresh Q/K/V/O may fill and stay resident")
    window_skip: float = param(1.0, 0.0, 1.0, "share of the key tiles before a sliding window that the kernel skips "
                               "(1: it starts each query tile's sweep at the window, as FlashAttention and TRT-LLM "
                               "do; 0: it sweeps the whole causal range and masks, as SGLang's Triton extend "
                               "kernel's time grows with the sequence, not the window)")
    tile_q: int = param(128, 16, 256, "query rows per CTA (kernel data)", fitted=False)
    tile_k: int = param(128, 16, 256, "keys per tile at head dim 128 (kernel data)", fitted=False)
    tile_k_by_head_dim: int = param(0, 0, 1, "1: keys per tile scale as 128 / head dim (a power of two in [32, 256]: "
                                    "the key tile's shared memory stays the same, FlashAttention-2's paged kernel); "
                                    "0: fixed (kernel data)", fitted=False)
    short_tile_q: int = param(0, 0, 2, "1: the kernel takes 16 or 64 query rows per CTA when a CTA's query rows "
                              "(query x query heads per KV head where they share CTAs, else the query) are at most "
                              "that many (TensorRT-LLM's context FMHA for short queries); 2: FlashInfer's whole rule "
                              "(FA2DetermineCtaTileQ), the same and never more than 64 rows at head dim 256; "
                              "0: always tile_q (kernel data)", fitted=False)
    tile_k_smem_kb: float = param(0.0, 0.0, 256.0, "shared memory per unit (KB) a kernel that sizes its key tile "
                                  "from it sees: FlashInfer's FA2 prefill takes the most 16-key MMA blocks that two "
                                  "(else one) CTAs of its query tile leave room for, at most 8 / its query MMAs "
                                  "(prefill.cuh NUM_MMA_KV; set to 100 KB for SGLang on L40S and RTX PRO 6000); 0: "
                                  "tile_k as given (kernel data)", fitted=False)
    shares_kv_head_ctas: int = param(1, 0, 1, "1: the query heads of one KV head may share CTAs (as pack_gqa says); "
                                     "0: never, a CTA per query head and query tile whatever the group "
                                     "(TensorRT-LLM's context FMHA: its short-query rows take the same time at "
                                     "every KV-head count, in proportion to sequences x query heads) "
                                     "(kernel data)", fitted=False)


@dataclass(frozen=True)
class DecodeAttentionParams(ParamSet):
    fixed_us: float = param(8.0, 0.0, 60.0, "per call, KV write included, us")
    combine_us: float = param(3.0, 0.0, 60.0, "the split-KV combine kernel, when keys are split, us")
    strided_us: float = param(0.0, 0.0, 30.0, "per call once both the batch and the KV heads exceed one (a strided "
                              "K/V layout the kernel copies first; A100 and L40S engines), us")
    cta_us: float = param(2.0, 0.0, 60.0, "latency of one CTA: load Q and the page table, epilogue, us")
    cta_head_dim_us: float = param(1.0, -10.0, 60.0, "CTA latency change per 128 of head dim, us")
    cta_group_us: float = param(0.02, 0.0, 10.0, "CTA latency per query head sharing a KV head, us")
    occupancy: float = param(2.0, 0.25, 16.0, "CTAs resident per unit", grid=(1.0, 2.0, 4.0))
    pack_gqa: float = param(1.0, 0.0, 1.0, "1: the query heads of a KV head share a CTA; 0: a CTA per query head",
                            grid=(0.0, 1.0))
    memory: float = param(0.88, 0.05, 1.0, "fraction of HBM bandwidth streaming the KV cache")
    unit_bandwidth_gbps: float = param(60.0, 1.0, 2000.0, "the most one CTA streams, GB/s")
    smoothness: float = param(1.2, 1.0, 10.0, "p of the soft max of CTA waves and streaming time")
    max_splits: float = param(32.0, 1.0, 256.0, "how many CTAs one sequence's keys may be split over")
    split_threshold: float = param(1.0, 0.05, 8.0, "no split once (sequence, KV head) CTAs fill this many waves")
    l2_speedup: float = param(2.0, 1.0, 8.0, "bandwidth of an L2-resident KV cache (benchmarks) over HBM")
    l2_fraction: float = param(0.76, 0.04, 1.0, "share of L2 a resident KV cache may fill")
    window_overread: float = param(1.1, 1.0, 3.0, "keys read per key of a sliding window (page edges, splits)")
    # decode kernels are compiled per head dim, as prefill's: an instance's time (CTA waves and streaming alike)
    # relative to the model's, interpolated in log2(head dim) between the compiled ones (1: no instance differs)
    head_dim_64: float = param(1.0, 0.2, 5.0, "time of the head-dim-64 kernel instance relative to the model's")
    head_dim_192: float = param(1.0, 0.2, 5.0, "time of the head-dim-192 kernel instance relative to the model's")
    head_dim_256: float = param(1.0, 0.2, 5.0, "time of the head-dim-256 kernel instance relative to the model's")
    head_dim_512: float = param(1.0, 0.2, 5.0, "time of the head-dim-512 (and above) instance relative to the "
                                "model's")
    block_n: int = param(128, 16, 512, "keys per split unit (kernel data)", fitted=False)
    # TensorRT-LLM's XQA decode kernel packs at most 32 query heads per KV head; a larger group runs its
    # masked-MHA kernel, a CTA per query head, re-reading the KV head's keys (every TensorRT-LLM table, A100 to
    # GB300: flat to 32 heads over one KV head, then x14-x36 at 64 and linear in the heads). MLA's absorbed decode
    # (its 128 heads over one latent) runs a kernel of its own built for that group, and takes no such limit
    max_group: int = param(4096, 1, 4096, "most query heads one CTA packs per KV head (kernel data)", fitted=False)
    # FlashInfer decodes a group of at least this many query heads per KV head on its tensor-core kernel (the
    # prefill kernel, the group fused into the query rows), a smaller one on its CUDA-core decode kernel: SGLang's
    # flashinfer backend asks for tensor cores from 4 heads on a 16-bit KV cache, always on fp8
    # (sglang/srt/layers/attention/flashinfer_backend.py should_use_tensor_core). The tensor-core kernel has a fit of
    # its own, `<kv>_tc`. 0: one kernel for every group
    tensor_core_group: int = param(0, 0, 4096, "groups of at least this many query heads run FlashInfer's "
                                   "tensor-core decode kernel, fitted apart (kernel data)", fitted=False)


def _sum_min_series(first, step, cap, count):
    """sum_{i<count} min(first + i*step, cap), elementwise (cap may be inf)."""
    below = np.clip(np.ceil((cap - first) / step), 0, count)  # terms still under the cap
    series = below * first + step * below * (below - 1) / 2
    return series + (count - below) * np.where(np.isfinite(cap), cap, 0.0)


def _strided_s(p, batch, kv_heads):
    """The engines that copy a strided K/V layout first do so once both the batch and the KV heads exceed one."""
    return ((batch > 1) & (kv_heads > 1)) * p.strided_us * 1e-6


def _head_dim_efficiency(p: PrefillAttentionParams, d, kv_shares_storage=False):
    """Flash kernels are compiled per head dim: interpolate the fitted efficiencies in log2(head dim). MLA's
    absorbed attention (576 over one latent) runs a kernel built for it, not the generic head-dim-512 instance:
    it keeps head dim 256's efficiency."""
    points = np.log2([64.0, 128.0, 192.0, 256.0, 512.0])
    factors = [p.head_dim_64, 1.0, p.head_dim_192, p.head_dim_256, p.head_dim_512]
    d = np.where(kv_shares_storage, np.minimum(d, 256.0), d)
    return p.compute * np.interp(np.log2(np.maximum(d, 1.0)), points, factors)


def prefill_tiles(p: PrefillAttentionParams, packed_rows, head_dim, v_head_dim=None, kv_bytes=2.0,
                  q_bytes: float = 2.0):
    """Query rows and keys per CTA tile: `tile_q` rows (16 or 64 when the packed query rows of a KV head fit
    them, on kernels with FlashInfer's rule), `tile_k` keys (scaled as 128 / head dim on kernels that keep
    the key tile's shared memory fixed, or sized from shared memory as FlashInfer's prefill does)."""
    rows, d, kvb = arrays(packed_rows, head_dim, kv_bytes)
    dv = d if v_head_dim is None else np.asarray(v_head_dim, dtype=float)
    tq = np.full_like(rows, float(p.tile_q))
    if p.short_tile_q:
        tq = np.where(rows <= 16, np.minimum(16.0, tq), np.where(rows <= 64, np.minimum(64.0, tq), tq))
    if p.short_tile_q >= 2:     # FlashInfer takes 128-row tiles only below head dim 256
        tq = np.where((d >= 256) & (rows > 16), np.minimum(64.0, tq), tq)
    tk = np.full_like(d, float(p.tile_k))
    if p.tile_k_by_head_dim:
        tk = np.clip(2.0 ** np.floor(np.log2(p.tile_k * 128.0 / np.maximum(d, 1.0))), 32.0, 256.0)
    if p.tile_k_smem_kb:
        tk = _flashinfer_tile_k(p.tile_k_smem_kb * 1024.0, tq, d, dv, kvb, q_bytes)
    return tq, tk


def _flashinfer_tile_k(smem, tq, d, dv, kv_bytes, q_bytes):
    """FlashInfer FA2 prefill's keys per tile: NUM_MMA_KV x NUM_WARPS_KV x 16. A 16-row query tile spreads four
    warps over the keys, larger ones one; the query tile and one 16-key block of K and V per KV warp must fit
    twice in a unit's shared memory for two CTAs to share it; the key blocks then take what is left of the CTA's
    share, a power of two up to 8 / the query tile's 64-row MMAs (registers)."""
    warps_kv = np.where(tq <= 16, 4.0, 1.0)
    mma_q = np.where(tq >= 128, 2.0, 1.0)
    q_smem = tq * d * q_bytes
    per_mma = (d + dv) * 16.0 * warps_kv * kv_bytes
    ctas = np.where(smem >= 2.0 * (q_smem + per_mma), 2.0, 1.0)
    room = np.floor((smem / ctas - q_smem) / per_mma)
    mma_kv = 2.0 ** np.floor(np.log2(np.clip(np.minimum(room, 8.0 / mma_q), 1.0, 8.0)))
    return mma_kv * warps_kv * 16.0


def prefill_attention_time(p: PrefillAttentionParams, compute_units: int, peak_flops: float, vector_flops: float,
                           bandwidth: float, l2_bytes: float, batch, query, context, heads, kv_heads, head_dim,
                           v_head_dim=None, window=0, kv_bytes=2.0, act_bytes: float = 2.0,
                           kv_shares_storage=False) -> Times:
    b, q, c, h, kvh, d, w, kvb = arrays(batch, query, context, heads, kv_heads, head_dim, window, kv_bytes)
    dv = d if v_head_dim is None else np.asarray(v_head_dim, dtype=float)
    group = h / kvh
    shares = bool(p.shares_kv_head_ctas)
    tq, tk = prefill_tiles(p, q * (group if shares else 1.0), d, dv, kvb, act_bytes)   # a CTA's query rows
    # keys one query tile sweeps: no more than the sequence, nor (on kernels that skip the tiles before a
    # sliding window) than the window past its first query
    windowed = np.minimum(c + q, np.where(w > 0, w + tq, np.inf))
    cap = windowed + (1.0 - p.window_skip) * (c + q - windowed)
    # GQA packing: the query rows of a KV head's query heads share CTAs (each packed tile sees all keys) when
    # they fit one tile, or (pack_gqa) whenever that takes fewer tiles than row blocks per head with causal skipping
    n_packed = np.ceil(q * group / tq)
    longest = np.ceil(cap / tk)                      # key tiles of the busiest CTA
    tiles_packed = n_packed * longest
    n_q = np.ceil(q / tq)
    keys_total = _sum_min_series(c + np.minimum(q, tq), tq, cap, n_q)  # causal: tile i sees keys up to its end
    tiles_unpacked = (keys_total / tk + n_q / 2) * group            # + half a partial key tile per query tile
    packed = shares & ((q * group <= tq) | ((p.pack_gqa >= 0.5) & (tiles_packed < tiles_unpacked)))
    tiles = np.where(packed, tiles_packed, tiles_unpacked)          # per (sequence, KV head)
    ctas = b * kvh * np.where(packed, n_packed, n_q * group)

    rate = peak_flops / compute_units * _head_dim_efficiency(p, d, kv_shares_storage)
    tile_s = (2.0 * tq * tk * (d + dv) / rate
              + tq * tk * p.softmax_ops / (vector_flops / compute_units))
    waves = np.ceil(ctas / (compute_units * p.occupancy))
    compute = (np.maximum(b * kvh * tiles / compute_units, longest) * tile_s
               + waves * (p.cta_us + p.cta_head_dim_us * d / 128.0) * 1e-6)
    q_and_o = b * q * h * (d + dv) * act_bytes
    prefix = b * kvh * np.minimum(c, np.where(w > 0, w, np.inf)) * (d + dv) * kvb    # cached prefix read
    # plus the new tokens' K/V written into the paged cache, and every CTA's loads of its key tiles
    # (query heads of one KV head in separate CTAs load the same tiles: L2 serves most of them)
    loads = b * kvh * tiles * tk * (d + dv) * kvb
    # the fresh Q, K, V and O were just written by the projection (or a benchmark's previous replay): the share
    # of them L2 holds streams from it, l2_speedup times faster; a cached prefix comes from HBM
    fresh = b * q * (h + kvh) * (d + dv) * act_bytes
    hit = np.minimum(1.0, l2_bytes * p.l2_fraction / np.maximum(fresh, 1.0))
    slowdown = hit / p.l2_speedup + (1.0 - hit)
    memory = (prefix / p.memory + (q_and_o / p.memory + loads / p.kv_load) * slowdown) / bandwidth
    # the new K/V go into the paged cache by a kernel of their own before attention runs: it adds
    write = (b * q * kvh * (d + dv) * (act_bytes + kvb) * slowdown / (bandwidth * p.write_memory)
             + b * q * (kvh * p.write_token_ns + p.write_row_ns) * 1e-9)
    fixed = p.fixed_us * 1e-6 + _strided_s(p, b, kvh) + np.zeros_like(memory)
    return Times(fixed + soft_max(compute, memory, p.smoothness) + write, compute, memory + write, fixed)


def decode_attention_time(p: DecodeAttentionParams, compute_units: int, bandwidth: float, l2_bytes: float,
                          batch, context, heads, kv_heads, head_dim, v_head_dim=None, window=0, kv_bytes=2.0,
                          act_bytes: float = 2.0, kv_shares_storage=False, resident: bool = False) -> Times:
    """One query per sequence over `context` cached keys plus its own. `resident`: the KV cache stays in L2
    between calls when it fits (a benchmark replaying one layer); a model step's layers each read their own.

    One CTA per (sequence, KV head) carries the query heads that share it; with too few of them to fill the
    chip the keys are split over more CTAs (and a combine kernel merges the partial results)."""
    b, c, h, kvh, d, w, kvb = arrays(batch, context, heads, kv_heads, head_dim, window, kv_bytes)
    dv = d if v_head_dim is None else np.asarray(v_head_dim, dtype=float)
    keys = np.where(w > 0, np.minimum(c + 1, w * p.window_overread), c + 1)
    group = h / kvh
    # too many query heads to pack: a CTA per query head (not MLA's latent, whose kernel packs all of them)
    beyond = (group > p.max_group) & ~np.asarray(kv_shares_storage, dtype=bool)
    pack = np.where(beyond, 0.0, p.pack_gqa)
    items = b * kvh * (1.0 + (group - 1.0) * (1.0 - pack))
    slots = compute_units * p.occupancy
    blocks = np.ceil(keys / p.block_n)
    splits = np.where(items >= p.split_threshold * slots, 1.0,
                      np.clip(np.ceil(slots / items), 1.0, np.minimum(blocks, p.max_splits)))
    key_bytes = (d + np.where(kv_shares_storage, 0.0, dv)) * kvb
    kv_read = items * keys * key_bytes
    hot = resident & (kv_read <= l2_bytes * p.l2_fraction)
    # past the packing limit the query heads of one KV head read its keys at about the same time: one read from
    # HBM, the repeats from L2
    repeats = np.where(beyond, kv_read * (1.0 - 1.0 / group), 0.0)
    from_memory = np.where(hot, kv_read / p.l2_speedup, kv_read - repeats + repeats / p.l2_speedup)
    stream = (from_memory + b * h * (d + dv) * act_bytes) / (bandwidth * p.memory)
    latency = np.maximum(p.cta_us + p.cta_head_dim_us * d / 128.0 + p.cta_group_us * group * pack, 0.05)
    cta = latency * 1e-6 + np.ceil(keys / splits) * key_bytes / (p.unit_bandwidth_gbps * 1e9)
    waves = np.ceil(items * splits / slots) * cta
    fixed = p.fixed_us * 1e-6 + (splits > 1) * p.combine_us * 1e-6 + _strided_s(p, b, kvh) + np.zeros_like(stream)
    instance = np.interp(np.log2(np.maximum(d, 1.0)), np.log2([64.0, 128.0, 192.0, 256.0, 512.0]),
                         [p.head_dim_64, 1.0, p.head_dim_192, p.head_dim_256, p.head_dim_512])
    return Times(fixed + instance * soft_max(waves, stream, p.smoothness), waves, stream, fixed)
