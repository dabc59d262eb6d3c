"""Trace one forward step of a model for a request: the entry point of the tracer."""
from __future__ import annotations

import json
import time
import warnings
from collections import OrderedDict
from dataclasses import replace
from typing import TYPE_CHECKING

from . import disk_cache
from .dtypes import DTYPE_BYTES, GEMM_COMPUTE_DTYPE, QUANTIZED_DTYPES, TORCH_DTYPE_NAMES
from .model_source import ModelError, ModelSpec, config_weight_dtype, resolve_model
from .work import GEMM, Op, Request, Trace, TraceOptions

if TYPE_CHECKING:  # torch and transformers load only when a trace is not cached
    from .build import BuiltModel


def validate(request: Request) -> None:
    if request.num_queries < 1:
        raise ValueError("num-queries must be >= 1")
    if request.query_length < 1:
        raise ValueError("query-length must be >= 1")
    if request.context_length < 0:
        raise ValueError("context-length must be >= 0")
    if request.decode and request.query_length != 1:
        raise ValueError("decode steps have query-length 1")


def _quantize_weights(ops: list[Op], dtype: str) -> list[Op]:
    """Price GEMM weights (and the GEMM itself) at a narrower format; the graph does not change."""
    scale = QUANTIZED_DTYPES[dtype] / 2.0
    out = []
    for op in ops:
        if op.op_class == GEMM:
            saved = op.weight_bytes * (1.0 - scale)
            op = replace(op, dtype=GEMM_COMPUTE_DTYPE[dtype], weight_bytes=op.weight_bytes - saved,
                         bytes_read=op.bytes_read - saved)
        out.append(op)
    return out


_TRACE_CACHE: OrderedDict = OrderedDict()


def prepare() -> None:
    """Version checks, imports and registrations: done once, outside the timed trace."""
    from . import attention, compat, experts
    compat.check_versions()
    attention.register()
    experts.register()
    import transformers.models.auto.modeling_auto  # noqa: F401  (heavy import, not tracing work)


def trace(model: str | ModelSpec, request: Request, options: TraceOptions = TraceOptions()) -> Trace:
    """Every op of one forward step, with exact work. Cached per (model, request, options)."""
    spec = resolve_model(model) if isinstance(model, str) else model
    validate(request)
    from_config = options.dtype == "auto"
    if from_config:
        options = replace(options, dtype=config_weight_dtype(spec.config) or "bf16")
    build_dtype = options.dtype if options.dtype in TORCH_DTYPE_NAMES else "bf16"
    if options.dtype not in TORCH_DTYPE_NAMES and options.dtype not in QUANTIZED_DTYPES:
        raise ModelError(f"unknown dtype '{options.dtype}' (choose from {', '.join(DTYPE_BYTES)})")
    kv_dtype = options.kv_cache_dtype or build_dtype
    if kv_dtype not in DTYPE_BYTES:
        raise ModelError(f"unknown kv-cache dtype '{kv_dtype}' (choose from {', '.join(DTYPE_BYTES)})")
    key = (spec.name, json.dumps(spec.config, sort_keys=True), request, options)
    if key in _TRACE_CACHE:
        _TRACE_CACHE.move_to_end(key)
        return _TRACE_CACHE[key]
    cached = disk_cache.load(key)
    if cached is not None:
        _remember(key, cached)
        return cached

    from .build import build_model
    prepare()
    start = time.perf_counter()
    built = build_model(spec, build_dtype, options.mla_form, options.trust_remote_code, options.dedup_layers)
    ops, unformulated = _run(built, request, kv_element_size=DTYPE_BYTES[kv_dtype],
                             moe_imbalance=options.moe_imbalance, model_name=spec.name)
    if options.dtype in QUANTIZED_DTYPES:
        ops = _quantize_weights(ops, options.dtype)
    kv_written = sum(op.bytes_written * op.count for op in ops if op.kv_cache_write)
    result = Trace(
        model=spec.name, request=request, options=options, ops=ops, params=built.params,
        active_params=built.active_params, num_layers=built.num_layers,
        kv_bytes_per_token=kv_written / max(1, request.tokens),
        weight_bytes=built.params * DTYPE_BYTES[options.dtype], trace_seconds=time.perf_counter() - start,
        kv_element_size=DTYPE_BYTES[kv_dtype], hidden_size=_hidden_size(built.config),
        unformulated=unformulated, notes=_notes(built, options, from_config))
    _remember(key, result)
    disk_cache.store(key, result)
    return result


def _remember(key, result: Trace) -> None:
    _TRACE_CACHE[key] = result
    while len(_TRACE_CACHE) > 512:
        _TRACE_CACHE.popitem(last=False)


def _hidden_size(config) -> int:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(getattr(text, "hidden_size", 0) or 0)


def _notes(built: BuiltModel, options: TraceOptions, from_config: bool = False) -> list[str]:
    notes = []
    if from_config and options.dtype in QUANTIZED_DTYPES:
        notes.append(f"weights priced as {options.dtype} from the config's quantization_config (--dtype overrides)")
    if built.mla_modules:
        notes.append("MLA attention in the absorbed (serving engine) form: latent KV cache, attention in latent space"
                     if options.mla_form == "absorbed" else
                     "MLA attention as HF runs it: the latent cache is re-expanded through kv_b_proj every step")
    if options.dtype in QUANTIZED_DTYPES:
        notes.append(f"{options.dtype} weights priced on a bf16 trace: GEMM weight bytes scaled, activations bf16")
    return notes


def _run(built: BuiltModel, request: Request, kv_element_size: float, moe_imbalance: float,
         model_name: str) -> tuple[list[Op], dict[str, int]]:
    """The step's ops (repeated layers multiplied) and the matrix ops that had no formula."""
    import torch

    from .kv_cache import MetaKVCache
    from .recorder import Recorder
    batch, q_len, context = request.num_queries, request.query_length, request.context_length
    recorder = Recorder(built.model)
    recorder.context_length = context
    recorder.kv_element_size = kv_element_size
    recorder.moe_imbalance = moe_imbalance
    with torch.device("meta"):
        input_ids = torch.zeros(batch, q_len, dtype=torch.long)
        positions = torch.arange(context, context + q_len).unsqueeze(0).expand(batch, -1)
    cache = MetaKVCache(built.num_layers, context)
    try:
        with torch.no_grad(), recorder, warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            built.model(input_ids=input_ids, position_ids=positions, past_key_values=cache, use_cache=True,
                        logits_to_keep=0 if request.all_logits else 1)
    except ModelError:
        raise
    except Exception as e:  # noqa: BLE001 - an unsupported model is a one-line error naming the module
        where = recorder.module[0] or type(built.model).__name__
        raise ModelError(f"{model_name}: tracing failed in module '{where}' ({recorder.module[1]}): "
                         f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    finally:
        recorder.close()
    ops = recorder.finish()
    multiplicity = {group[0]: len(group) for group in built.layer_groups}
    return ([op.times(multiplicity.get(op.layer, 1)) if op.layer is not None else op for op in ops],
            dict(recorder.unformulated))
