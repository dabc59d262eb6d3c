"""Trace one forward step of a model for a request: the entry point of the tracer."""
from __future__ import annotations

import functools
import gc
import json
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from . import disk_cache
from .dtypes import DTYPE_BYTES, GEMM_COMPUTE_DTYPE, QUANTIZED_DTYPES, TORCH_DTYPE_NAMES
from .model_source import ModelError, ModelSpec, config_weight_dtype, resolve_model
from .weight_formats import CheckpointFormats, assign_formats, checkpoint_formats, formats_summary, uniform_formats
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


def _quantize_weights(ops: list[Op]) -> list[Op]:
    """Price each GEMM's weights (and the GEMM itself) at its checkpoint format; the graph does not change."""
    out = []
    for op in ops:
        if op.op_class == GEMM and op.weight_format in QUANTIZED_DTYPES:
            saved = op.weight_bytes * (1.0 - QUANTIZED_DTYPES[op.weight_format] / 2.0)
            op = replace(op, dtype=GEMM_COMPUTE_DTYPE[op.weight_format], weight_bytes=op.weight_bytes - saved,
                         bytes_read=op.bytes_read - saved)
        out.append(op)
    return out


def checkpoint_formats_for(spec: ModelSpec, options: TraceOptions, from_config: bool) -> CheckpointFormats | None:
    """The per-module formats a trace prices: the config's own with --dtype auto, else one format throughout."""
    if from_config:
        return checkpoint_formats(spec.config)
    return uniform_formats(options.dtype) if options.dtype in QUANTIZED_DTYPES else None


_TRACE_CACHE: OrderedDict = OrderedDict()


_PREPARED: list = []     # [True] once prepare() has run in this process


def prepare() -> None:
    """Version checks, imports and registrations: done once, outside the timed trace. The objects torch and
    transformers create on import live as long as the process; once imported they are frozen out of the cyclic
    garbage collector (gc.freeze), which would otherwise walk all of them on every full collection (about a fifth
    of a second each, several per search)."""
    from . import attention, compat, experts
    compat.check_versions()
    attention.register()
    experts.register()
    if not _PREPARED:
        import transformers.models.auto.modeling_auto  # noqa: F401  (heavy import, not tracing work)
        gc.freeze()
        _PREPARED.append(True)


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
    kv_size = DTYPE_BYTES[kv_dtype]
    traced = _as_traced(built, request)
    recomputed = traced is not request
    if options.dedup_layers:
        from .checks import dedup_verdict
        from .layers import DEDUP, FULL, PROBE

        def probe(req: Request, mode: str) -> Trace:
            built.layers.mode = mode
            try:
                run = _run(built, _as_traced(built, req), options, kv_size, spec.name, check=False)
            finally:
                built.layers.mode = DEDUP
            return Trace(model=spec.name, request=req, options=options, ops=run.ops, params=0, active_params=0,
                         num_layers=built.num_layers, kv_bytes_per_token=0.0, weight_bytes=0.0)
        _warm_up(built, options, kv_size, spec.name, PROBE)
        built.dedup_verdict = dedup_verdict(built, probe)
        built.layers.mode = DEDUP if built.dedup_verdict == "ok" else FULL
    else:
        _warm_up(built, options, kv_size, spec.name, built.layers.mode)
    formats = checkpoint_formats_for(spec, options, from_config)
    run = _run(built, traced, options, kv_size, spec.name, formats=formats)
    if recomputed:
        why = "attends bidirectionally (causal=false), so no KV cache stays valid" if _bidirectional(built.config) \
            else "keeps no KV cache"
        run.notes.append(f"{type(built.model).__name__} {why}: this step recomputes all {request.seq_len} "
                         f"tokens of each sequence ({request.context_length} earlier + {request.query_length} new), "
                         f"as transformers runs it")
        import inspect
        if "mems" in inspect.signature(built.model.forward).parameters:
            run.notes.append("its forward can also take `mems` (Transformer-XL's memory of earlier hidden states, "
                             "from which keys and values are projected again each step): that path is not traced")
    ops = _quantize_weights(run.ops)
    kv_written = sum(op.bytes_written * op.count for op in ops if op.kv_cache_write)
    state_bytes = sum(op.state.state_bytes * op.count for op in ops if op.state is not None)
    result = Trace(
        model=spec.name, request=request, options=options, ops=ops, params=built.params,
        active_params=built.active_params, num_layers=built.num_layers,
        kv_bytes_per_token=kv_written / max(1, request.num_queries * run.query_length),
        weight_bytes=_stored_bytes(built, formats, build_dtype, (options.dtype, from_config)),
        trace_seconds=time.perf_counter() - start,
        kv_element_size=kv_size, hidden_size=_hidden_size(built.config),
        unformulated=run.unformulated, notes=_notes(built, options, from_config, run), checks=run.checks,
        state_bytes_per_sequence=state_bytes, image_tokens=run.image_tokens, recomputes_context=recomputed,
        architecture=_architecture(spec.config, built))
    _remember(key, result)
    disk_cache.store(key, result)
    return result


def _architecture(config: dict, built: BuiltModel) -> str:
    """The model class the config names, as engines read it (hf_config.architectures[0]); else the class built."""
    named = config.get("architectures")
    return named[0] if isinstance(named, list) and named and isinstance(named[0], str) else type(built.model).__name__


def _warm_up(built: BuiltModel, options: TraceOptions, kv_size: float, name: str, mode: str) -> None:
    """One untimed forward over the layers `mode` traces: some models convert buffers on their first call (CTRL's
    and CodeGen's position tables), which is not a step's work."""
    if mode in built.warmed:
        return
    saved, built.layers.mode = built.layers.mode, mode
    try:
        _run(built, Request(1, 1, 0), replace(options, image_tokens=0), kv_size, name, check=False)
    finally:
        built.layers.mode = saved
    built.warmed.add(mode)
    if mode == "probe":
        built.warmed.add("dedup")


def _remember(key, result: Trace) -> None:
    _TRACE_CACHE[key] = result
    while len(_TRACE_CACHE) > 512:
        _TRACE_CACHE.popitem(last=False)


def _output_module(built: BuiltModel) -> str | None:
    """The path of the module producing the logits (lm_head), if the model has one."""
    model = built.model
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return built.tree.paths.get(id(head)) if head is not None else None


def _stored_bytes(built: BuiltModel, formats: CheckpointFormats | None, unquantized: str, key: tuple) -> float:
    """stored_weight_bytes, once per built model and weight format: a property of the model, not of the step."""
    if key not in built.stored_bytes:
        built.stored_bytes[key] = stored_weight_bytes(built, formats, unquantized)
    return built.stored_bytes[key]


def stored_weight_bytes(built: BuiltModel, formats: CheckpointFormats | None, unquantized: str) -> float:
    """Every parameter at its stored format: matrices of linear layers and experts in the checkpoint's format
    (routers by their name, as the config reads), embeddings, norms and biases unquantized."""
    import torch

    from .build import _expert_tensors
    from .weight_formats import EXPERTS, LINEAR, LM_HEAD
    plain = DTYPE_BYTES[unquantized]
    if formats is None:
        return built.params * plain
    head = _output_module(built)
    total, seen = 0.0, set()
    for name, module in built.model.named_modules():
        for p in module.parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            role = EXPERTS if _expert_tensors(module) else LM_HEAD if name == head else LINEAR
            quantizable = p.dim() >= 2 and not isinstance(module, torch.nn.Embedding)
            fmt = formats.format_of(name, role, unquantized) if quantizable else unquantized
            total += p.numel() * DTYPE_BYTES[fmt]
    return total


def _hidden_size(config) -> int:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(getattr(text, "hidden_size", 0) or 0)


def _notes(built: BuiltModel, options: TraceOptions, from_config: bool, run: "Run") -> list[str]:
    notes = []
    if from_config and options.dtype in QUANTIZED_DTYPES:
        notes.append(f"weights priced as {options.dtype} from the config's quantization_config (--dtype overrides)")
    quantization = built.config.to_dict().get("quantization_config") if hasattr(built.config, "to_dict") else None
    if from_config and options.dtype not in QUANTIZED_DTYPES and isinstance(quantization, dict):
        notes.append(f"quantization_config (quant_method {quantization.get('quant_method')!r}) not read: weights "
                     f"priced as {options.dtype} (--dtype sets a format)")
    if built.mla_modules:
        notes.append("MLA attention in the absorbed (serving engine) form: latent KV cache, attention in latent space"
                     if options.mla_form == "absorbed" else
                     "MLA attention as HF runs it: the latent cache is re-expanded through kv_b_proj every step")
    if options.dtype in QUANTIZED_DTYPES:
        notes.append(f"{options.dtype} weights priced on a bf16 trace: GEMM weight bytes scaled, activations bf16")
        notes.append(formats_summary(run.ops))
    if built.dedup_verdict not in (None, "ok"):
        notes.append(f"{built.dedup_verdict}: every decoder layer is traced")
    if any(op.state is not None for op in run.ops):
        from .recurrent import state_note
        notes.append(state_note())
    if any(op.attention is not None and op.attention.chunk for op in run.ops):
        notes.append("chunked local attention: a query attends only to the keys of its own chunk")
    return notes + built.notes + run.notes


@dataclass
class Run:
    """One traced forward: the ops (repeated layers multiplied) and what the checks found."""
    ops: list[Op]
    unformulated: dict[str, int]
    query_length: int                    # per sequence, image tokens (and a first step's soft prompt) included
    image_tokens: int = 0
    cached_prompt: int = 0               # soft-prompt tokens in the cache besides the request's context
    notes: list[str] = field(default_factory=list)
    checks: dict[str, str] = field(default_factory=dict)


_CACHE_ARGUMENTS = ("past_key_values", "cache", "cache_params")  # by release and family


def _takes_cache(model) -> bool:
    import inspect
    return any(n in inspect.signature(model.forward).parameters for n in (*_CACHE_ARGUMENTS, "state"))  # RWKV


# models whose forward takes the whole sequence and drops the cached tokens itself, by the class holding the slice:
# modeling_xlm.py XLMModel.forward ("do not recompute cached elements": input_ids[:, -(slen - cached):]),
# modeling_cpmant.py CpmAntModel.forward (hidden_states[:, past_length:])
_WHOLE_SEQUENCE_INPUT = ("XLMModel", "CpmAntModel")
# models that put learned prompt tokens ahead of every sequence, by class: the config field with their count
# (modeling_cpmant.py: prompt_length tokens prepended, dropped from the output after the first step)
_SOFT_PROMPT = {"CpmAntModel": "prompt_length"}


def module_class_names(model) -> frozenset:
    """The class names of every module of a built model (patches.module_classes: walked once per model)."""
    from .patches import module_classes
    return frozenset(cls.__name__ for cls in module_classes(model))


def _soft_prompt(built: BuiltModel) -> int:
    field_name = next((_SOFT_PROMPT[name] for name in module_class_names(built.model) if name in _SOFT_PROMPT), None)
    return int(getattr(built.config, field_name, 0) or 0) if field_name else 0


def _as_traced(built: BuiltModel, request: Request) -> Request:
    """The step as transformers runs it. A model whose forward keeps no KV cache (GPT-1, XLNet) runs every step over
    the whole sequence again: the step over `context` earlier tokens is the forward of all context + query tokens.
    So does a model whose attention is bidirectional (XLM's causal=false): a new token changes every earlier token's
    states, so no KV cache stays valid (HF's forward over one fails)."""
    if request.context_length > 0 and (not _takes_cache(built.model) or _bidirectional(built.config)):
        return Request(request.num_queries, request.seq_len, 0, all_logits=request.all_logits)
    return request


def _bidirectional(config) -> bool:
    """The config says its self-attention is not causal (XLM, FlauBERT: `causal`, false by default)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, "causal", None) is False


def _takes_whole_sequence(model) -> bool:
    return not module_class_names(model).isdisjoint(_WHOLE_SEQUENCE_INPUT)


def _lengths(model, batch: int, length: int) -> dict:
    """XLM's sentence lengths ([B], every sequence full), which its forward checks with `.item()`: a tiny CPU tensor
    (meta has no values); the masks built from them are meta (patches.py)."""
    import inspect

    import torch
    if "lengths" not in inspect.signature(model.forward).parameters or not _takes_whole_sequence(model):
        return {}
    return {"lengths": torch.full((batch,), length, dtype=torch.long, device="cpu")}


def _forward_kwargs(model, cache, logits_rows: int | None) -> dict:
    """The cache under the name the model's forward takes it, and logits_to_keep where it is accepted."""
    import inspect
    params = inspect.signature(model.forward).parameters
    kwargs = {"use_cache": True}
    name = next((n for n in _CACHE_ARGUMENTS if n in params), None)
    if name is not None:
        kwargs[name] = cache
    if "logits_to_keep" in params:
        kwargs["logits_to_keep"] = 0 if logits_rows is None else logits_rows
    return kwargs


def _padding_mask(model, batch: int, length: int) -> dict:
    """The all-ones [B, C+Q] padding mask generation passes, for models whose forward reads its shape (GIT while
    decoding). Others get none: many inspect its values, which meta tensors do not have."""
    import inspect

    import torch
    if "attention_mask" not in inspect.signature(model.forward).parameters:
        return {}
    owners = {type(model)} | {type(m) for m in model.children()}
    needs = any(_forward_reads_mask_shape(cls) for cls in owners)
    return {"attention_mask": torch.ones(batch, length, dtype=torch.long, device="meta")} if needs else {}


@functools.lru_cache(maxsize=None)
def _forward_reads_mask_shape(cls: type) -> bool:
    """_reads_mask_shape_unguarded of a class's forward, parsed once per class (each trace asks); False where its
    source cannot be read."""
    import inspect
    try:
        return _reads_mask_shape_unguarded(inspect.getsource(cls.forward))
    except (OSError, TypeError, SyntaxError):
        return False


def _reads_mask_shape_unguarded(source: str) -> bool:
    """The forward reads `attention_mask.shape` where no `attention_mask is not None` test guards it (GIT in
    transformers 5.17 while decoding). Where it is guarded (GIT in 5.24, which then widens a given mask by the
    image tokens it assumes cached), passing no mask is what generation without one does."""
    import ast
    import textwrap

    def guards(test: ast.AST) -> bool:
        return any(isinstance(n, ast.Compare) and isinstance(n.left, ast.Name) and n.left.id == "attention_mask"
                   and any(isinstance(op, ast.IsNot) for op in n.ops) for n in ast.walk(test))

    def unguarded(node: ast.AST, safe: bool) -> bool:
        if isinstance(node, ast.Attribute) and node.attr == "shape" and isinstance(node.value, ast.Name) \
                and node.value.id == "attention_mask":
            return not safe
        if isinstance(node, (ast.If, ast.IfExp)):
            inner = safe or guards(node.test)
            body = node.body if isinstance(node.body, list) else [node.body]
            orelse = node.orelse if isinstance(node.orelse, list) else [node.orelse]
            return unguarded(node.test, safe) or any(unguarded(n, inner) for n in body) or \
                any(unguarded(n, safe) for n in orelse)
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
            for value in node.values:
                if unguarded(value, safe):
                    return True
                safe = safe or guards(value)
            return False
        return any(unguarded(child, safe) for child in ast.iter_child_nodes(node))
    return unguarded(ast.parse(textwrap.dedent(source)), False)


def _run(built: BuiltModel, request: Request, options: TraceOptions, kv_element_size: float, model_name: str,
         check: bool = True, formats: CheckpointFormats | None = None) -> Run:
    """Trace one forward step; with `check`, stop with a one-line error when a self-check fails."""
    import torch

    from .kv_cache import model_cache
    from .patches import patched
    from .recorder import Recorder
    image_tokens = options.image_tokens if not request.decode else 0
    if image_tokens and getattr(built.config, "vision_config", None) is None:
        raise ModelError(f"{model_name}: --image-tokens needs a vision-language config (one with a vision_config); "
                         f"{type(built.model).__name__} is text-only")
    batch, q_len, context = request.num_queries, request.query_length + image_tokens, request.context_length
    prompt = _soft_prompt(built)  # the first step computes the soft prompt too; later steps find it cached
    cached, rows = (context + prompt, q_len) if context > 0 else (0, q_len + prompt)
    recorder = Recorder(built.model, built.layers.path, built.tree)
    recorder.context_length = cached
    recorder.kv_element_size = kv_element_size
    recorder.moe_imbalance = options.moe_imbalance
    recorder.inline.batch = batch
    logits_rows = None if request.all_logits else 1
    first = 0 if _takes_whole_sequence(built.model) else context  # the forward slices off the cached part itself
    with torch.device("meta"):
        input_ids = torch.zeros(batch, context + q_len - first, dtype=torch.long)
        positions = torch.arange(first, context + q_len).unsqueeze(0).expand(batch, -1)
    cache = model_cache(built.model, built.num_layers, cached, built.config, batch)
    kwargs = {**_forward_kwargs(built.model, cache, logits_rows), **_padding_mask(built.model, batch, context + q_len),
              **_lengths(built.model, batch, context + q_len)}
    vision_note = None
    try:
        with torch.no_grad(), recorder, warnings.catch_warnings(), patched(built.model, recorder, logits_rows):
            warnings.simplefilter("ignore")
            if image_tokens:
                from .vision import encode_images
                vision_note = encode_images(built.model, built.config, recorder, image_tokens, batch).note
            if context > 0 and getattr(cache, "has_states", False):
                with recorder.suppressed():  # one token shapes the recurrent states; the step then continues them
                    built.model(input_ids=input_ids[:, :1], position_ids=positions[:, :1], **kwargs)
                cache.continue_states()
            built.model(input_ids=input_ids, position_ids=positions, **kwargs)
    except ModelError:
        raise
    except Exception as e:  # noqa: BLE001 - an unsupported model is a one-line error naming the module
        where = recorder.module[0] or type(built.model).__name__
        text = str(e).strip()
        missing = getattr(e, "name", None) if isinstance(e, AttributeError) else None
        if missing and type(getattr(e, "obj", None)).__module__ == "tracer.kv_cache":
            # the model keeps a KV state of its own kind (DeepSeek-V4's compressed entries) through its own
            # cache layer's methods, which the meta cache does not have
            raise ModelError(f"unsupported: {model_name}: module '{where}' ({recorder.module[1]}) keeps its own "
                             f"kind of KV cache state (through the cache method '{missing}'), which tracecost's "
                             f"meta cache does not model") from None
        raise ModelError(f"unsupported: {model_name}: tracing failed in module '{where}' ({recorder.module[1]}): "
                         f"{type(e).__name__}: {text.splitlines()[0] if text else ''}") from None
    finally:
        recorder.close()
    raw_ops = recorder.finish()
    unquantized = options.dtype if options.dtype in TORCH_DTYPE_NAMES else "bf16"
    ops = assign_formats(raw_ops, formats, built.layers.path, built.layer_groups, _output_module(built),
                         unquantized)
    run = Run(ops=ops, unformulated=dict(recorder.unformulated), query_length=rows, image_tokens=image_tokens,
              notes=[vision_note] if vision_note else [], cached_prompt=cached - context)
    if prompt:
        run.notes.append(f"{type(built.model).__name__}'s {prompt} soft-prompt tokens run through every layer with the "
                         f"first step and stay cached (the cache holds them besides the text tokens)")
    if check:
        _check(built, run, recorder, request, model_name)
    return run


def _check(built: BuiltModel, run: Run, recorder, request: Request, model_name: str) -> None:
    from .checks import context_problems, flop_identity
    batch = request.num_queries
    tokens = batch * run.query_length
    logits_rows = tokens if request.all_logits else batch
    identity = flop_identity(built, recorder.params_read, recorder.param_rows, run.ops, tokens, logits_rows,
                             batch * (request.context_length + run.cached_prompt + run.query_length),
                             recorder.expert_params)
    if not identity.holds:
        raise ModelError(f"unsupported: {model_name}: FLOP identity check failed: {identity.describe()}")
    run.checks["flop_identity"] = f"holds: {identity.traced:.6g} GEMM FLOPs = 2 x params x rows"
    problems = context_problems(run.ops, replace(request, context_length=request.context_length + run.cached_prompt))
    if problems:
        raise ModelError(f"unsupported: {model_name}: cache check failed: {problems[0]}")
    run.checks["cache"] = "every attention op sees the whole context; recurrent ops continue their state"
    run.checks["dedup"] = built.dedup_verdict or ("off" if not built.layers.active else "not run")
    if identity.unread_params:
        run.notes.append(f"{identity.unread_params / 1e6:.1f}M matrix parameters take no part in a text-only step "
                         f"(e.g. cross-attention or an encoder) and are not counted in its work")
    if identity.reused_weights:
        run.notes.append(f"{', '.join(identity.reused_weights)}: applied more than once per step, as HF runs the model")
    if identity.per_head_weights:
        run.notes.append(f"{', '.join(identity.per_head_weights)}: one weight applied to every head of every token")
    if identity.position_weights:
        run.notes.append(f"{', '.join(identity.position_weights)}: applied to the relative-position table (every "
                         f"query-key distance of each sequence), as HF runs the model")
    if identity.mixing:
        run.notes.append(f"{identity.mixing:.3g} FLOPs of tiny per-token products without weights (e.g. AltUp "
                         f"mixing) are counted as traced")
    if identity.cache_weights and not built.mla_modules:
        run.notes.append(f"{', '.join(identity.cache_weights)}: multiplied with every cached token each step, as HF "
                         f"runs the model")
