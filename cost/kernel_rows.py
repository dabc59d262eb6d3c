"""Kernel calls as the published kernel tables time them: typed rows, parsed from JSON, priced in bulk.

A row is one kernel call; its timed region is what the AIConfigurator collectors time:
- gemm: x[m,k] @ W[n,k]^T; fp8, fp8_block and nvfp4 include the activation's quantization kernel. `role`
  (router, lm_head, mla_absorbed) and formats beyond the fitted ones (mxfp4, int4, or fp8 on a GPU without
  fp8) run as the engine runs them (cost/op_formats.py): its rules, weight-only where the device lacks them.
  The collectors cycle 6 weight copies (bf16, fp8) or 1 (fp8_block, nvfp4) in a CUDA graph, so small
  weights stay in L2; `"cold": true` prices weights streamed from HBM as in a model step.
- attention: `batch` sequences of `query` new tokens over `context` cached ones (decode: query 1, over
  context + 1 keys), writing the new K/V into the paged cache. Decode benchmarks replay one layer, so a KV
  cache that fits stays in L2 (`"cold": true` reads it from HBM).
- moe: the whole fused-MoE layer of one rank: `tokens` on the rank, global `experts` and `inter`, the rank
  holding experts/ep whole experts and inter/tp of each. `distribution`: balanced (default),
  power_law_<alpha> (the most loaded EP rank), or random. `runner`: the engine's MoE runner where it is not its
  default one (cost/engine_kernels/moe_runners.py: SGLang's flashinfer_trtllm or flashinfer_cutlass).
- allreduce: `bytes` per GPU over `gpus`, with the engine's custom all-reduce or NCCL.
"""
from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, fields

import numpy as np

from .engine_kernels import (ROUTINGS, EngineCalibration, Times, allreduce_time, decode_attention_time, gemm_time,
                             host_issue_s, moe_time, nearest_curve, prefill_attention_time, quant_time, routing_stats)
from .engine_kernels.calibration import ATTENTION_BACKENDS
from .engine_kernels.common import soft_max
from .engine_kernels.moe_runners import key_format, moe_key, runners, split_key
from .engine_kernels.tuned_moe import tuned_mask
from .engines import ENGINES
from .profile import HardwareProfile, ProfileError

GEMM_DTYPES = ("bf16", "fp8", "fp8_block", "nvfp4")
MOE_DTYPES = ("bf16", "fp8", "fp8_block", "nvfp4", "int4")
# formats a row may ask for beyond the fitted kernel models: run as the engine runs them (cost/op_formats.py),
# weight-only on devices without the matrix type
ROW_GEMM_DTYPES = GEMM_DTYPES + ("mxfp4", "int4")
ROW_MOE_DTYPES = MOE_DTYPES + ("mxfp4",)
GEMM_ROLES = ("linear", "router", "lm_head", "mla_absorbed")   # tracer/weight_formats.py WEIGHT_ROLES
KV_DTYPES = ("bf16", "fp8")
# weight bytes, the matrix-unit dtype, and the quantized activation's bytes (None: bf16 activations)
WEIGHT_FORMATS = {"bf16": (2.0, "bf16", None), "fp8": (1.0, "fp8", 1.0), "fp8_block": (1.0, "fp8", 1.0),
                  "nvfp4": (0.5625, "fp4", 0.5625), "int4": (0.5, "bf16", None)}
# the weight copies a kernel table's GEMM benchmark cycles through per format, by the engine whose collector timed it
# (AIConfigurator's collector/<engine>/collect_gemm.py): a row's weights stay in L2 when its copies fit there.
# vLLM: 6, one for block-fp8 and nvfp4; SGLang: 6 (fewer only where six would not fit in 45% of the GPU's memory);
# TensorRT-LLM: 5 (min(5, ceil(L2 / weight bytes)) since its 1.3.0rc20 tables, which keeps the same rows in L2)
TABLE_WEIGHT_COPIES = {"vllm": {"bf16": 6, "fp8": 6, "fp8_block": 1, "nvfp4": 1},
                       "sglang": {"bf16": 6, "fp8": 6, "fp8_block": 6, "nvfp4": 6},
                       "trtllm": {"bf16": 5, "fp8": 5, "fp8_block": 5, "nvfp4": 5}}


class RowError(ValueError):
    """A malformed kernel row; the message names the line."""


@dataclass(frozen=True)
class GemmRow:
    m: int
    n: int
    k: int
    dtype: str = "bf16"
    cold: bool = False
    role: str = "linear"     # what the weight is: an engine may run a router gate or MLA's bmm in bf16


@dataclass(frozen=True)
class AttentionRow:
    phase: str
    batch: int
    query: int
    context: int
    heads: int
    kv_heads: int
    head_dim: int
    window: int = 0
    kv_dtype: str = "bf16"
    cold: bool = False
    backend: str = ""        # an engine's other attention backend, fitted apart ("triton": SGLang's), "" its default


@dataclass(frozen=True)
class MoeRow:
    tokens: int
    hidden: int
    inter: int
    experts: int
    top_k: int
    tp: int = 1
    ep: int = 1
    dtype: str = "bf16"
    distribution: str = "balanced"
    gated: bool = True       # gate and up projections (SwiGLU); false for relu^2 experts (Nemotron-H)
    runner: str = ""         # the engine's MoE runner, "" for its default one (moe_runners.py)


@dataclass(frozen=True)
class AllreduceRow:
    bytes: int
    gpus: int
    impl: str = "custom"


ROW_TYPES = {"gemm": GemmRow, "attention": AttentionRow, "moe": MoeRow, "allreduce": AllreduceRow}
_CHOICES = {"dtype": {GemmRow: ROW_GEMM_DTYPES, MoeRow: ROW_MOE_DTYPES}, "kv_dtype": KV_DTYPES,
            "phase": ("prefill", "decode"), "impl": ("custom", "nccl"), "role": GEMM_ROLES,
            "runner": ("",) + runners(), "backend": ("",) + ATTENTION_BACKENDS}
_ZERO_OK = {"context", "window"}
PASSTHROUGH = {"id", "label", "source", "measured_ms"}   # a row may carry these; they are written back untouched


def parse_row(obj, line: int):
    """One JSON object into a typed row; every error names the line and the field."""
    if not isinstance(obj, dict):
        raise RowError(f"line {line}: a row is a JSON object with an 'op'")
    op = obj.get("op")
    if op not in ROW_TYPES:
        raise RowError(f"line {line}: 'op' must be one of {', '.join(ROW_TYPES)}, got {op!r}")
    cls = ROW_TYPES[op]
    known = {f.name: f for f in fields(cls)}
    extra = sorted(set(obj) - set(known) - {"op"} - PASSTHROUGH)
    if extra:
        raise RowError(f"line {line}: unknown field '{extra[0]}' for op {op} (fields: {', '.join(known)})")
    values = {}
    for name, f in known.items():
        if name not in obj:
            if f.default is MISSING:
                raise RowError(f"line {line}: op {op} needs field '{name}'")
            continue
        value = obj[name]
        if f.type == "int":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value != int(value) or value < (0 if name in _ZERO_OK else 1) or value > 2**40:
                low = 0 if name in _ZERO_OK else 1
                raise RowError(f"line {line}: '{name}' must be an integer >= {low}, got {value!r}")
            value = int(value)
        elif f.type == "bool":
            if not isinstance(value, bool):
                raise RowError(f"line {line}: '{name}' must be true or false")
        elif name == "distribution":
            try:
                routing_stats(value if isinstance(value, str) else "?", 1, 2, 1)
            except ValueError:
                raise RowError(f"line {line}: 'distribution' must be one of {', '.join(ROUTINGS)} "
                               f"(or power_law_<alpha>), got {value!r}") from None
        else:
            choices = _CHOICES[name]
            choices = choices[cls] if isinstance(choices, dict) else choices
            if value not in choices:
                named = ", ".join(c or '"" (the engine\'s default)' for c in choices)
                raise RowError(f"line {line}: '{name}' must be one of {named}, got {value!r}")
        values[name] = value
    row = cls(**values)
    if isinstance(row, AttentionRow):
        if row.heads % row.kv_heads:
            raise RowError(f"line {line}: kv_heads {row.kv_heads} must divide heads {row.heads}")
        if row.phase == "decode" and row.query != 1:
            raise RowError(f"line {line}: a decode row has query 1 (one new token over context + 1 keys)")
    if isinstance(row, MoeRow):
        if row.experts % row.ep or row.inter % row.tp or row.top_k > row.experts:
            raise RowError(f"line {line}: ep must divide experts, tp must divide inter, top_k <= experts")
        if row.tp > 1 and row.ep > 1:
            raise RowError(f"line {line}: a MoE row has tp or ep, not both (as the engines' fused-MoE layer)")
    if isinstance(row, AllreduceRow) and row.gpus < 2:
        raise RowError(f"line {line}: an all-reduce needs gpus >= 2")
    return row


def _columns(rows, *names) -> list[np.ndarray]:
    return [np.array([getattr(r, n) for r in rows], dtype=float) for n in names]


def _need(table: dict, key: str, what: str, cal: EngineCalibration):
    if key not in table:
        raise ProfileError(f"{cal.engine}: no {what} '{key}' kernel model on this device (has: "
                           f"{', '.join(table) or 'none'})")
    return table[key]


def gemm_rows_time(cal: EngineCalibration, hw: HardwareProfile, dtype: str, m, n, k, cold, params=None,
                   quant_fused: bool = False, weight_bytes: float | None = None, model_step: bool = False) -> Times:
    """`quant_fused`: the activations arrive quantized (an engine fusing it into the previous kernel), so
    the quantization passes the tables time with the GEMM are left out. `weight_bytes`: the stored width when
    it differs from the kernel's own (a weight-only GEMM: the bf16 kernel streaming 8- or 4-bit weights).
    `model_step`: the call runs inside a model step (a CUDA graph replay), where the host's time to issue it
    (`host_us`, timed by tables that call it outside a graph) is hidden."""
    stored, compute_dtype, quant_bytes = WEIGHT_FORMATS[dtype]
    weight_bytes = stored if weight_bytes is None else weight_bytes
    p = params or _need(cal.gemm, dtype, "GEMM format", cal)
    copies = np.where(cold, 0.0, TABLE_WEIGHT_COPIES.get(cal.engine, TABLE_WEIGHT_COPIES["vllm"]).get(dtype, 1))
    t = gemm_time(p, hw.compute_units, hw.matrix_peak(compute_dtype), hw.bandwidth, hw.l2_bytes, m, n, k,
                  act_bytes=quant_bytes or 2.0, weight_bytes=weight_bytes, resident_weight_copies=copies)
    if quant_bytes is not None and not quant_fused:
        q = quant_time(cal.quant, hw.bandwidth, hw.l2_bytes, m, k, quant_bytes=quant_bytes)
        passes = p.quant_passes
        t = Times(t.seconds + passes * q.seconds, t.compute_s, t.memory_s + passes * q.memory_s,
                  t.fixed_s + passes * q.fixed_s)
    if model_step:
        return t
    # the host issues the GEMM and its quantization kernels; the device's work overlaps that time
    wait = soft_max(t.seconds, host_issue_s(p, m, n, k), p.host_overlap) - t.seconds
    return Times(t.seconds + wait, t.compute_s, t.memory_s, t.fixed_s + wait)


def attention_model_key(table: dict, kv_dtype: str, windowed: bool, kernel: str = "") -> str:
    """Sliding-window attention runs its own kernel instance: its fit when there is one, else the full one's.
    `kernel` 'mha': the engine's multi-head decode kernel, its own fit where the profile has one (windowed, then
    full), else the grouped-query kernel's."""
    names = [f"{kv_dtype}_window", kv_dtype] if windowed else [kv_dtype]
    if kernel:
        names = [f"{n}_{kernel}" for n in names] + names
    return next((name for name in names[:-1] if name in table), names[-1])


def attention_model(table: dict, kv_dtype: str, windowed: bool, what: str, cal: EngineCalibration,
                    kernel: str = ""):
    return _need(table, attention_model_key(table, kv_dtype, windowed, kernel), what, cal)


def decode_kernel(kv_key: str, engine: str | None, group: float, kv_shares_storage: bool = False,
                  decode_sets: dict | None = None) -> str:
    """The decode kernel a KV format's call of `group` query heads per KV head runs on `engine`: '' (the grouped-query
    kernel), 'mha' (the engine's multi-head kernel) or 'tc' (FlashInfer's tensor-core kernel, where the device's
    decode set `kv_key` in `decode_sets` says from which group on)."""
    kernel = ENGINES[engine].decode_kernel(group, kv_shares_storage) if engine in ENGINES else ""
    plain = (decode_sets or {}).get(kv_key)
    if not kernel and plain is not None and plain.tensor_core_group and not kv_shares_storage \
            and group >= plain.tensor_core_group:
        kernel = "tc"
    return kernel


def decode_kernel_key(kv_key: str, engine: str | None, group: float, kv_shares_storage: bool = False,
                      decode_sets: dict | None = None) -> str:
    """The decode set that prices a KV format's call of `group` query heads per KV head on `engine`."""
    kernel = decode_kernel(kv_key, engine, group, kv_shares_storage, decode_sets)
    return f"{kv_key}_{kernel}" if kernel else kv_key


def _kv_key_parts(kv_key: str) -> tuple[str, bool, str]:
    """A group's KV key (`fp8_window_mha`) as (KV format, sliding window, decode kernel)."""
    kernel = next((k for k in ("mha", "tc") + ATTENTION_BACKENDS if kv_key.endswith(f"_{k}")), "")
    kv_key = kv_key.removesuffix(f"_{kernel}") if kernel else kv_key
    return kv_key.removesuffix("_window"), kv_key.endswith("_window"), kernel


def attention_rows_time(cal: EngineCalibration, hw: HardwareProfile, phase: str, kv_key: str, batch, query, context,
                        heads, kv_heads, head_dim, window, cold, params=None) -> Times:
    """`kv_key`: the KV format, `_window` for sliding-window rows, `_mha` for an engine's multi-head decode kernel."""
    kv_dtype, windowed, kernel = _kv_key_parts(kv_key)
    kv_bytes = 1.0 if kv_dtype == "fp8" else 2.0
    if phase == "decode":
        p = params or attention_model(cal.decode_attention, kv_dtype, windowed, "decode attention KV format", cal,
                                      kernel)
        return decode_attention_time(p, hw.compute_units, hw.bandwidth, hw.l2_bytes, batch, context, heads, kv_heads,
                                     head_dim, window=window, kv_bytes=kv_bytes, resident=~np.asarray(cold, bool))
    p = params or attention_model(cal.prefill_attention, kv_dtype, windowed, "prefill attention KV format", cal,
                                  kernel)
    return prefill_attention_time(p, hw.compute_units, hw.matrix_peak("bf16"), hw.vector_peak("fp32"), hw.bandwidth,
                                  hw.l2_bytes, batch, query, context, heads, kv_heads, head_dim, window=window,
                                  kv_bytes=kv_bytes)


def moe_rows_time(cal: EngineCalibration, hw: HardwareProfile, model: str, rows: list[MoeRow], params=None,
                  weight_bytes: float | None = None) -> Times:
    """`model`: the calibration's MoE key, a format or `<format>_<runner>` (moe_runners.py)."""
    dtype = key_format(model)
    stored, compute_dtype, _ = WEIGHT_FORMATS[dtype]
    weight_bytes = stored if weight_bytes is None else weight_bytes
    p = params or _need(cal.moe, model, "MoE format", cal)
    stats = [routing_stats(r.distribution, r.tokens, r.experts, r.top_k, r.ep) for r in rows]
    tokens, hidden, inter, tp, top_k = _columns(rows, "tokens", "hidden", "inter", "tp", "top_k")
    return moe_time(p, hw.compute_units, hw.matrix_peak(compute_dtype), hw.bandwidth, tokens, hidden, inter / tp,
                    top_k, [s.pairs for s in stats], [s.active_experts for s in stats],
                    np.array([s.padded_tiles for s in stats]), gated=np.array([r.gated for r in rows]),
                    weight_bytes=weight_bytes, local_experts=np.array([r.experts / r.ep for r in rows]),
                    tuned=tuned_mask(cal.engine, hw.key, model, [r.experts // r.ep for r in rows],
                                     [r.inter // r.tp for r in rows]))


def allreduce_rows_time(cal: EngineCalibration, impl: str, gpus: int, nbytes, curve=None) -> Times:
    if curve is None:
        curves = _need(cal.allreduce, impl, "all-reduce implementation", cal)
        curve, _ = nearest_curve(curves, gpus)
    return allreduce_time(curve, nbytes, gpus)


def group_key(row, engine: str | None = None, decode_sets: dict | None = None) -> tuple:
    """Rows priced together share one kernel model (and one fit); `engine` picks its decode kernel by group, as
    does the device's calibration (`decode_sets`: its decode_attention section) where it names a group limit."""
    if isinstance(row, GemmRow):
        return ("gemm", row.dtype)
    if isinstance(row, AttentionRow):
        kv_key = row.kv_dtype + ("_window" if row.window else "")
        if row.backend:     # another backend's kernels: a model of their own, in either phase
            phase = "decode" if row.phase == "decode" or _decodes(row, engine) else row.phase
            return ("attention", phase, f"{kv_key}_{row.backend}")
        if row.phase == "decode" or _decodes(row, engine):
            return ("attention", "decode", decode_kernel_key(kv_key, engine, row.heads / row.kv_heads,
                                                             decode_sets=decode_sets))
        return ("attention", row.phase, kv_key)
    if isinstance(row, MoeRow):
        return ("moe", moe_key(row.dtype, row.runner))
    return ("allreduce", row.impl, row.gpus)


def _decodes(row: AttentionRow, engine: str | None) -> bool:
    """A prefill row of one-token prompts that the engine runs on its decode kernel (Engine.one_token_query_decodes)."""
    return row.phase == "prefill" and row.query == 1 and engine in ENGINES and ENGINES[engine].one_token_query_decodes


def price_group(cal: EngineCalibration, hw: HardwareProfile, key: tuple, rows: list, params=None,
                weight_bytes: float | None = None) -> Times:
    kind = key[0]
    if kind == "gemm":
        m, n, k = _columns(rows, "m", "n", "k")
        return gemm_rows_time(cal, hw, key[1], m, n, k, np.array([r.cold for r in rows]), params,
                              weight_bytes=weight_bytes)
    if kind == "attention":
        cols = _columns(rows, "batch", "query", "context", "heads", "kv_heads", "head_dim", "window")
        if key[1] == "decode":   # a one-token prompt priced as a decode reads its own key
            cols[2] = np.where([r.phase == "prefill" for r in rows], np.maximum(cols[2], 1), cols[2])
        return attention_rows_time(cal, hw, key[1], key[2], *cols, np.array([r.cold for r in rows]), params)
    if kind == "moe":
        return moe_rows_time(cal, hw, key[1], rows, params, weight_bytes=weight_bytes)
    return allreduce_rows_time(cal, key[1], key[2], _columns(rows, "bytes")[0], params)


def group_rows(rows: list, engine: str | None = None, decode_sets: dict | None = None) -> dict[tuple, list[int]]:
    """Row indices by the kernel model that prices them (`group_key`), in first-seen order."""
    groups: dict[tuple, list[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(group_key(row, engine, decode_sets), []).append(i)
    return groups


def price_rows(cal: EngineCalibration, hw: HardwareProfile, rows: list) -> np.ndarray:
    """Seconds per row, in row order; rows of one kernel model are priced in one vectorized call. A GEMM or MoE
    row runs in the format the engine runs it in (cost/op_formats.py): its role's rule, or weight-only where the
    device lacks the format's matrix type."""
    return price_rows_traced(cal, hw, rows)[0]


def price_rows_traced(cal: EngineCalibration, hw: HardwareProfile, rows: list) -> tuple[np.ndarray, list[str]]:
    """price_rows, and per row the profile's fitted model that priced it ("decode_attention.bf16_mha",
    "gemm.fp8 (weight-only)", "allreduce.nccl x8")."""
    from .engine_pricing import weight_only_kernel
    from .op_formats import WEIGHT_ONLY, run_format
    seconds, models = np.zeros(len(rows)), [""] * len(rows)
    for key, index in group_rows(rows, cal.engine, cal.decode_attention).items():
        if key[0] not in ("gemm", "moe"):
            seconds[index] = price_group(cal, hw, key, [rows[i] for i in index]).seconds
            name = _model_name(cal, key)
            for i in index:
                models[i] = name
            continue
        by_role: dict[str, list[int]] = {}
        for i in index:
            by_role.setdefault(getattr(rows[i], "role", "experts"), []).append(i)
        fmt, runner = split_key(key[1]) if key[0] == "moe" else (key[1], "")
        for role, part in by_role.items():
            f = run_format(CHECKPOINT_FORMAT.get(fmt, fmt), role, cal.engine, hw, moe=key[0] == "moe",
                           moe_models=tuple(cal.moe), gemm_models=tuple(cal.gemm))
            group = [rows[i] for i in part]
            on_runner = moe_key(f.kernel, runner)
            model = on_runner if key[0] == "moe" and on_runner in cal.moe else f.kernel
            t = price_group(cal, hw, (key[0], model), group, weight_bytes=f.weight_bytes / f.stream_fraction)
            if f.how == WEIGHT_ONLY:
                t = weight_only_kernel(t, f, hw, _row_flops(key[0], group))
            seconds[part] = t.seconds
            name = f"{key[0]}.{model}" + (f" ({WEIGHT_ONLY})" if f.how == WEIGHT_ONLY else "")
            for i in part:
                models[i] = name
    return seconds, models


def _row_flops(kind: str, rows: list) -> np.ndarray:
    """FLOPs of each GEMM row, or of each fused-MoE row's expert GEMMs on its rank."""
    from .engine_pricing import moe_flops
    if kind == "gemm":
        return np.array([2.0 * r.m * r.n * r.k for r in rows])
    return np.array([float(moe_flops(r.tokens * r.top_k / r.ep, r.hidden, r.inter / r.tp, r.gated)) for r in rows])


def _model_name(cal: EngineCalibration, key: tuple) -> str:
    """The fitted model of a group already priced (so its section and implementation exist)."""
    if key[0] == "attention":
        table = cal.decode_attention if key[1] == "decode" else cal.prefill_attention
        return f"{key[1]}_attention.{attention_model_key(table, *_kv_key_parts(key[2]))}"
    _, gpus = nearest_curve(cal.allreduce[key[1]], key[2])
    return f"allreduce.{key[1]} x{gpus}"


CHECKPOINT_FORMAT = {"nvfp4": "fp4"}   # a row's kernel name -> the checkpoint format (tracer/dtypes.py) it stores
