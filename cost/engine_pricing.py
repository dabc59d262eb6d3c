"""Price an engine's kernels (cost/execution.py, engine execution) with its fitted kernel models.

In a model step every layer reads its own weights and KV cache, so weights and KV stream from HBM
(`cold`), unlike the kernel benchmarks that replay one layer; activations stay in L2 when they fit.
"""
from __future__ import annotations

from .engine_kernels import (EngineCalibration, Times, decode_attention_time, moe_time, prefill_attention_time,
                             routing_stats, stream_time)
from .engines import ENGINES
from .execution import Kernel
from .kernel_rows import WEIGHT_FORMATS, attention_model, gemm_rows_time
from .kernels import KernelTime
from .profile import HardwareProfile, ProfileError

# trace weight dtype -> the engine's GEMM / fused-MoE kernel family (int8 W8A8 runs the per-tensor fp8 path's
# kernels at the int8 peak; int4 weight-only runs bf16 math on 4-bit weights)
GEMM_FORMAT = {"bf16": "bf16", "fp16": "bf16", "fp32": "bf16", "fp8": "fp8", "fp8_block": "fp8_block",
               "int8": "fp8", "fp4": "nvfp4", "int4": "bf16"}
MOE_FORMAT = {"bf16": "bf16", "fp16": "bf16", "fp32": "bf16", "fp8": "fp8", "fp8_block": "fp8_block",
              "int8": "fp8", "fp4": "nvfp4", "int4": "int4"}


def _kernel_time(t: Times) -> KernelTime:
    t = t.scalar()
    return KernelTime(t.seconds, t.compute_s, t.memory_s, t.fixed_s)


def _weight_format(weight_dtype: str) -> str:
    if weight_dtype not in GEMM_FORMAT:
        raise ProfileError(f"no engine kernel model for weight dtype '{weight_dtype}'")
    return GEMM_FORMAT[weight_dtype]


def gemm_seconds(k: Kernel, hw: HardwareProfile, cal: EngineCalibration, weight_dtype: str) -> KernelTime:
    g = k.gemm
    fmt = _weight_format(weight_dtype)
    fused = fmt in ENGINES[cal.engine].fused_activation_quant
    # a batched GEMM (MLA's per-head absorption) has a weight per batch entry: as wide as all of them
    return _kernel_time(gemm_rows_time(cal, hw, fmt, g.m, g.n * max(1, g.batch), g.k, True, quant_fused=fused))


def attention_seconds(k: Kernel, hw: HardwareProfile, cal: EngineCalibration, kv_bytes: float) -> KernelTime:
    w = k.op.attention
    kv_format = "fp8" if kv_bytes <= 1 else "bf16"
    window = w.window or 0
    if w.query_length == 1 and w.context_length > 0:
        p = attention_model(cal.decode_attention, kv_format, window > 0, "decode attention KV format", cal)
        t = decode_attention_time(p, hw.compute_units, hw.bandwidth, hw.l2_bytes, w.batch, w.context_length, w.heads,
                                  w.kv_heads, w.qk_head_dim, w.v_head_dim, window=window,
                                  kv_bytes=1.0 if kv_format == "fp8" else 2.0, kv_shares_storage=w.kv_shares_storage)
    else:
        p = attention_model(cal.prefill_attention, kv_format, window > 0, "prefill attention KV format", cal)
        t = prefill_attention_time(p, hw.compute_units, hw.matrix_peak("bf16"), hw.vector_peak("fp32"), hw.bandwidth,
                                   hw.l2_bytes, w.batch, w.query_length, w.context_length, w.heads, w.kv_heads,
                                   w.qk_head_dim, w.v_head_dim, window=window, kv_bytes=1.0 if kv_format == "fp8" else 2.0)
    return _kernel_time(t)


def moe_seconds(k: Kernel, hw: HardwareProfile, cal: EngineCalibration, weight_dtype: str) -> KernelTime:
    c = k.moe
    fmt = MOE_FORMAT.get(weight_dtype, "bf16")
    p = _section(cal.moe, fmt, "fused MoE", cal)
    weight_bytes, compute_dtype, _ = WEIGHT_FORMATS[fmt]
    stats = routing_stats("random", c.tokens, c.experts, c.top_k, c.ep)
    t = moe_time(p, hw.compute_units, hw.matrix_peak(compute_dtype), hw.bandwidth, c.tokens, c.hidden,
                 c.inter / c.tp, c.top_k, stats.pairs, stats.active_experts, stats.padded_tiles, gated=c.gated,
                 weight_bytes=weight_bytes)
    return _kernel_time(t)


def stream_seconds(k: Kernel, hw: HardwareProfile, cal: EngineCalibration) -> KernelTime:
    # a fused kernel reads its inputs and writes its outputs once: half and half is close enough for a stream
    return _kernel_time(stream_time(cal.elementwise, hw.bandwidth, hw.l2_bytes, k.bytes / 2, k.bytes / 2))


def price_engine_kernel(k: Kernel, hw: HardwareProfile, cal: EngineCalibration, weight_dtype: str,
                        kv_bytes: float) -> KernelTime:
    """`weight_dtype`: the trace's weight format (every GEMM of a trace has it); `kv_bytes`: KV element size."""
    if k.moe is not None:
        return moe_seconds(k, hw, cal, weight_dtype)
    if k.op is not None and k.op.attention is not None:
        return attention_seconds(k, hw, cal, kv_bytes)
    if k.gemm is not None and k.op_class == "gemm":
        return gemm_seconds(k, hw, cal, weight_dtype)
    return stream_seconds(k, hw, cal)


def _section(table: dict, key: str, what: str, cal: EngineCalibration):
    if key not in table:
        raise ProfileError(f"{cal.engine}: no {what} model for '{key}' on this device (has: {', '.join(table) or 'none'})")
    return table[key]
