"""Price an engine's kernels (cost/execution.py, engine execution) with its fitted kernel models.

In a model step every layer reads its own weights and KV cache, so weights and KV stream from HBM
(`cold`), unlike the kernel benchmarks that replay one layer; activations stay in L2 when they fit.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np

from .engine_kernels import (EngineCalibration, Times, decode_attention_time, moe_time, prefill_attention_time,
                             routing_stats, stream_time)
from .engine_kernels.tuned_moe import tuned_mask
from .engine_kernels.unified_attention import unified_prefill_time
from .engines import ENGINES
from .execution import Kernel
from .kernel_rows import WEIGHT_FORMATS, attention_model, decode_kernel, gemm_rows_time
from .kernels import KernelTime
from .op_formats import RunFormat
from .profile import HardwareProfile, ProfileError

def _kernel_time(t: Times) -> KernelTime:
    t = t.scalar()
    return KernelTime(t.seconds, t.compute_s, t.memory_s, t.fixed_s)


def gemm_seconds(k: Kernel, hw: HardwareProfile, cal: EngineCalibration, fmt: RunFormat) -> KernelTime:
    g = k.gemm
    fused = fmt.kernel in ENGINES[cal.engine].fused_activation_quant
    # a batched GEMM (MLA's per-head absorption) has a weight per batch entry: as wide as all of them
    n = g.n * max(1, g.batch)
    t = gemm_rows_time(cal, hw, fmt.kernel, g.m, n, g.k, True, quant_fused=fused,
                       weight_bytes=fmt.weight_bytes / fmt.stream_fraction, model_step=True).scalar()
    return _kernel_time(weight_only_kernel(t, fmt, hw, 2.0 * g.m * n * g.k))


def weight_only_kernel(t: Times, fmt: RunFormat, hw: HardwareProfile, flops) -> Times:
    """A weight-only kernel priced as the bf16 one (on fmt.weight_bytes / fmt.stream_fraction) plus its cost per
    call, and no faster than its math ceiling (cost/op_formats.py RunFormat; 1 and 0: the bf16 kernel's)."""
    call = fmt.call_us * 1e-6
    seconds, fixed = t.seconds + call, t.fixed_s + call
    if fmt.math_peak_fraction >= 1.0:
        return Times(seconds, t.compute_s, t.memory_s, fixed)
    ceiling = flops / (fmt.math_peak_fraction * hw.matrix_peak("bf16"))
    return Times(np.maximum(seconds, ceiling + fixed), np.maximum(t.compute_s, ceiling), t.memory_s, fixed)


def chunk_segments(query_length: int, context_length: int, chunk: int) -> list[tuple[int, int, int]]:
    """A chunked-attention step as the virtual sequences an engine runs it in: (query, context, count), one per
    piece of [context, context + query) that lies in one chunk, each over the keys of its chunk before it."""
    counts: Counter[tuple[int, int]] = Counter()
    p, end = context_length, context_length + query_length
    while p < end:
        stop = min(end, (p // chunk + 1) * chunk)
        counts[stop - p, p % chunk] += 1
        p = stop
    return [(q, c, n) for (q, c), n in counts.items()]


def attention_seconds(k: Kernel, hw: HardwareProfile, cal: EngineCalibration, kv_bytes: float,
                      mixed_step: bool = False) -> KernelTime:
    """`mixed_step`: the step also carries a prompt chunk, so its decode rows may run in the prefill kernel
    (decode_rows_in_prefill)."""
    w = k.op.attention
    if w.chunk_binds and ENGINES[cal.engine].runs_attention_chunks:
        parts = [_attention_time(replace(w, batch=w.batch * n, query_length=q, context_length=c, chunk=None),
                                 hw, cal, kv_bytes, mixed_step)
                 for q, c, n in chunk_segments(w.query_length, w.context_length, w.chunk)]
        return KernelTime(*(sum(getattr(t, f) for t in parts) for f in ("seconds", "compute_s", "memory_s", "fixed_s")))
    return _attention_time(w, hw, cal, kv_bytes, mixed_step)


def decode_rows_in_prefill(w, cal: EngineCalibration) -> bool:
    """Whether one-token decode rows of a step that also carries a prompt chunk run in the engine's prefill kernel
    (EngineCalibration.mixed_step_decodes): not MLA's absorbed decode (its backends split the batch), nor an
    attention with sink logits that the engine runs on another kernel here."""
    return (bool(cal.mixed_step_decodes) and w.query_length == 1 and not w.kv_shares_storage
            and not (w.has_sinks and cal.sink_attention))


def _attention_time(w, hw: HardwareProfile, cal: EngineCalibration, kv_bytes: float,
                    mixed_step: bool = False) -> KernelTime:
    kv_format = "fp8" if kv_bytes <= 1 else "bf16"
    element = 1.0 if kv_format == "fp8" else 2.0    # the bytes of a cached K or V element the kernels read
    window = w.window or 0
    engine = ENGINES[cal.engine]
    # an attention with sink logits on another backend of the engine's, fitted apart (SGLang's Triton kernels)
    backend = cal.sink_backend if w.has_sinks else ""
    in_prefill = mixed_step and decode_rows_in_prefill(w, cal)
    if w.query_length == 1 and not in_prefill and (w.context_length > 0 or engine.one_token_query_decodes):
        kernel = backend or decode_kernel(kv_format + ("_window" if window > 0 else ""), cal.engine,
                                          w.heads / w.kv_heads, w.kv_shares_storage, cal.decode_attention)
        p = attention_model(cal.decode_attention, kv_format, window > 0, "decode attention KV format", cal, kernel)
        # a one-token prompt (engine.one_token_query_decodes) reads its own key
        t = decode_attention_time(p, hw.compute_units, hw.bandwidth, hw.l2_bytes, w.batch, max(w.context_length, 1),
                                  w.heads, w.kv_heads, w.qk_head_dim, w.v_head_dim, window=window,
                                  kv_bytes=element, kv_shares_storage=w.kv_shares_storage)
    elif w.expanded_head_dims and engine.mla_prefill and engine.mla_prefill.expanded(w.query_length,
                                                                                      w.batch * w.context_length):
        t = expanded_mla_prefill(w, hw, cal)
    else:
        p = attention_model(cal.prefill_attention, kv_format, window > 0, "prefill attention KV format", cal,
                            backend)
        if in_prefill and not cal.mixed_step_decodes["packs_gqa"]:
            # a CTA per query head: the prefill model's GQA packing of short queries is the one-query path's
            # (FlashAttention-2 swaps a KV head's query heads into rows only when every query is one token)
            p = replace(p, shares_kv_head_ctas=0)
        t = prefill_attention_time(p, hw.compute_units, hw.matrix_peak("bf16"), hw.vector_peak("fp32"), hw.bandwidth,
                                   hw.l2_bytes, w.batch, w.query_length, w.context_length, w.heads, w.kv_heads,
                                   w.qk_head_dim, w.v_head_dim, window=window,
                                   kv_bytes=element, kv_shares_storage=w.kv_shares_storage)
        if w.has_sinks and cal.sink_attention.get("kernel") == "triton_unified":
            t = unified_prefill_time(t, cal.elementwise, hw.bandwidth, hw.l2_bytes, w.batch, w.query_length,
                                     w.context_length, w.heads, w.kv_heads, w.qk_head_dim, w.v_head_dim, window,
                                     kv_bytes=element,
                                     l2_share=cal.sink_attention.get("l2_share", 1.0))
    return _kernel_time(t)


def expanded_mla_prefill(w, hw: HardwareProfile, cal: EngineCalibration) -> Times:
    """MLA over a prompt chunk as engines prefill it (cost/engines.py MlaPrefill): FlashAttention over every head's
    own K and V at the expanded head dims, in bf16 whatever the cache's format (the up-projection writes them), and
    the up-projection of the cached context's latent through kv_b_proj, priced as a bf16 GEMM. The chunk's own
    tokens take the absorbed bmm the trace records for them: the same FLOPs as their up-projection."""
    qk, v = w.expanded_head_dims
    p = attention_model(cal.prefill_attention, "bf16", False, "prefill attention KV format", cal)
    t = prefill_attention_time(p, hw.compute_units, hw.matrix_peak("bf16"), hw.vector_peak("fp32"), hw.bandwidth,
                               hw.l2_bytes, w.batch, w.query_length, w.context_length, w.heads, w.heads, qk, v).scalar()
    if w.context_length <= 0:
        return t
    latent = w.v_head_dim                       # the absorbed form's V is the latent
    nope = qk - (w.qk_head_dim - latent)        # its K is the latent and the rope dims
    up = gemm_rows_time(cal, hw, "bf16", w.batch * w.context_length, w.heads * (nope + v), latent, True,
                        model_step=True).scalar()
    return Times(t.seconds + up.seconds, t.compute_s + up.compute_s, t.memory_s + up.memory_s, t.fixed_s + up.fixed_s)


def moe_seconds(k: Kernel, hw: HardwareProfile, cal: EngineCalibration, fmt: RunFormat) -> KernelTime:
    c = k.moe
    p = _section(cal.moe, fmt.model, "fused MoE", cal)
    _, compute_dtype, _ = WEIGHT_FORMATS[fmt.kernel]
    weight_bytes = fmt.weight_bytes / fmt.stream_fraction
    stats = routing_stats("random", c.tokens, c.experts, c.top_k, c.ep, c.imbalance)
    t = moe_time(p, hw.compute_units, hw.matrix_peak(compute_dtype), hw.bandwidth, c.tokens, c.hidden,
                 c.inter / c.tp, c.top_k, stats.pairs, stats.active_experts, stats.padded_tiles, gated=c.gated,
                 weight_bytes=weight_bytes, local_experts=c.experts / c.ep,
                 tuned=tuned_mask(cal.engine, hw.key, fmt.model, c.experts // c.ep, c.inter // c.tp)).scalar()
    return _kernel_time(weight_only_kernel(t, fmt, hw, moe_flops(stats.pairs, c.hidden, c.inter / c.tp, c.gated)))


def moe_flops(pairs, hidden, inter_local, gated: bool):
    """Both expert GEMMs of a fused-MoE layer: up (and gate) projection, then down."""
    return 2.0 * np.asarray(pairs, dtype=float) * hidden * inter_local * np.where(gated, 3.0, 2.0)


def stream_seconds(k: Kernel, hw: HardwareProfile, cal: EngineCalibration) -> KernelTime:
    # a fused kernel reads its inputs and writes its outputs once: half and half is close enough for a stream
    return _kernel_time(stream_time(cal.elementwise, hw.bandwidth, hw.l2_bytes, k.bytes / 2, k.bytes / 2))


def price_engine_kernel(k: Kernel, hw: HardwareProfile, cal: EngineCalibration, fmt: RunFormat | None,
                        kv_bytes: float, mixed_step: bool = False) -> KernelTime:
    """`fmt`: how the engine runs a GEMM's weights (cost/op_formats.py); `kv_bytes`: KV element size;
    `mixed_step`: the step also carries a prompt chunk (attention_seconds)."""
    if k.moe is not None:
        return moe_seconds(k, hw, cal, fmt)
    if k.op is not None and k.op.attention is not None:
        return attention_seconds(k, hw, cal, kv_bytes, mixed_step)
    if k.gemm is not None and k.op_class == "gemm":
        return gemm_seconds(k, hw, cal, fmt)
    return stream_seconds(k, hw, cal)


def _section(table: dict, key: str, what: str, cal: EngineCalibration):
    if key not in table:
        raise ProfileError(f"{cal.engine}: no {what} model for '{key}' on this device (has: {', '.join(table) or 'none'})")
    return table[key]
