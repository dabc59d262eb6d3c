"""Records every aten op of a meta-device forward with its work, owning module and dataflow.

The recorder is a TorchDispatchMode: it sees ops after autograd and composite decomposition,
which is the level kernels run at. Module ownership comes from forward hooks; dataflow (which
op produced each tensor) lets the engine execution mode price a fused kernel by the bytes that
actually cross its boundary.
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from . import op_formulas
from .inline_attention import InlineAttention
from .module_tree import ModuleTree
from .work import (FUSION_ACTIVATION, FUSION_CAST, FUSION_NORM, FUSION_RESIDUAL, FUSION_ROTARY, GEMM,
                   OTHER, AttentionWork, ExpertsWork, GemmShape, Op, StateWork)

FUSION_ROUTING = "routing"
_CASTS = {"_to_copy", "clone", "to", "contiguous", "_unsafe_view"}
_BIAS_FIRST = {"addmm", "baddbmm", "addmv", "addbmm"}
# attention and MLP blocks of a decoder layer: the scope inside which an engine fuses ops of one kind
_BLOCKS = r"(?:self_attn|attention|self_attention|attn|mlp|block_sparse_moe|feed_forward|ffn|moe)"
_ACTIVE: list["Recorder"] = []


def active_recorder() -> "Recorder | None":
    return _ACTIVE[-1] if _ACTIVE else None


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64",
            torch.int64: "int64", torch.int32: "int32", torch.bool: "bool", torch.int8: "int8",
            torch.uint8: "uint8"}.get(dtype, str(dtype).replace("torch.", ""))


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass
class _Raw:
    """An op while tracing; frozen into `work.Op` once the dataflow is known."""
    name: str
    op_class: str
    unit: str
    flops: float
    dtype: str
    module: str
    module_type: str
    layer: int | None
    shapes: tuple
    out_shape: tuple
    reads: list = field(default_factory=list)       # (producer index or None, bytes)
    bytes_read: float = 0.0
    bytes_written: float = 0.0
    weight_bytes: float = 0.0
    fusion_group: str | None = None
    tp_sharded: bool = False
    gemm: GemmShape | None = None
    attention: AttentionWork | None = None
    experts: ExpertsWork | None = None
    state: StateWork | None = None
    kv_cache_write: bool = False
    broadcast: bool = False
    operand: str | None = None      # "param" / "buffer": the op reads a weight (or a view or cast of one)
    weight_module: str | None = None  # the module owning the parameter a GEMM multiplies
    weight_role: str | None = None    # set while a model applies a weight outside its module (MLA absorption)
    consumers: set = field(default_factory=set)


def _fusion_group(name: str, op_class: str, module_type: str) -> str | None:
    if op_class != OTHER:
        return None
    mt = module_type.lower()
    if "norm" in mt:
        return FUSION_NORM
    if "rotary" in mt or "attention" in mt or "indexer" in mt:   # a DSA indexer's norm, rotary and scaling
        return FUSION_ROTARY
    if "mlp" in mt or "experts" in mt or "activation" in mt or mt.endswith("act"):
        return FUSION_ACTIVATION
    if "router" in mt or "gate" == mt or "moe" in mt or "sparse" in mt:
        return FUSION_ROUTING
    if "decoderlayer" in mt or "block" in mt:
        return FUSION_RESIDUAL
    # a dtype cast outside those modules still fuses into its neighbour in an engine
    return FUSION_CAST if name.endswith("_to_copy") else None


def _tp_sharded(module_path: str, module_type: str) -> bool:
    mt = module_type.lower()
    if "indexer" in mt or ".indexer" in module_path:
        return False  # a DSA indexer runs whole on every rank (vLLM's and SGLang's ReplicatedLinear, all its heads)
    if "norm" in mt and module_path.count(".") <= 3:
        return False  # layer norms act on the full hidden state, replicated on every rank
    return any(k in mt for k in ("attention", "mlp", "experts", "moe", "linear", "embedding", "mixer", "mamba",
                                 "deltanet")) or \
        any(k in module_path for k in ("self_attn", "mlp", "lm_head", "embed_tokens", "experts", "mixer", "linear_attn"))


class Recorder(TorchDispatchMode):
    def __init__(self, model: torch.nn.Module, layer_path: str = "model.layers", tree: ModuleTree | None = None):
        """`tree`: the model's module tree when already walked (tracer/module_tree.py; walked here otherwise)."""
        super().__init__()
        # the decoder layer list's path: ops under `<layer_path>.<i>` belong to layer i
        self._layer_re = re.compile(r"^" + re.escape(layer_path) + r"\.(\d+)(?:\.|$)")
        self._block_re = re.compile(r"^(" + re.escape(layer_path) + r"\.\d+\." + _BLOCKS + r")(?:\.|$)")
        self.ops: list[_Raw] = []
        self.unformulated: dict[str, int] = {}
        self._producer = WeakIdKeyDictionary()
        self._params = WeakIdKeyDictionary()
        self._stack: list[tuple[str, str]] = [("", type(model).__name__)]
        self.modules: list[torch.nn.Module] = [model]   # the module objects of `_stack`
        self._hooks = []
        self._suppress = 0
        self.context_length = 0
        self.kv_element_size = 2
        self.moe_imbalance = 1.0
        self.pending_experts = None  # set by the experts implementation around HF's grouped_mm path
        self.inline = InlineAttention(self)  # attention a model computes as matmuls over the cached keys
        # a parameter or buffer, or a view or cast of one -> that parameter or buffer (for the FLOP identity)
        self._weight_of = WeakIdKeyDictionary()
        self._buffers = WeakIdKeyDictionary()
        self.params_read: dict[int, set[str]] = {}  # id of a parameter -> classes of the recorded ops that read it
        self.param_rows: dict[int, list[float]] = {}  # id of a parameter -> rows of each GEMM that multiplied it
        # id of a routed experts' weight -> (top_k, experts, ops that read it) of the routed ops that read it
        self.expert_params: dict[int, tuple[int, int, int]] = {}
        self._last_roots: list = []
        self.weight_role: str | None = None  # the role of the weights the next GEMMs multiply (weight_formats)
        self._owner = WeakIdKeyDictionary()  # parameter -> the module path that holds it
        tree = tree or ModuleTree(model)
        for name, p in tree.named_parameters():
            self._owner[p] = name.rsplit(".", 1)[0] if "." in name else ""
            self._params[p] = True
            self._weight_of[p] = p
        for b in tree.buffers():
            self._buffers[b] = True
            self._weight_of[b] = b
        # two process-wide module hooks, not two per module: registering a thousand hooks cost more than the
        # forward itself (a DeepSeek-V3 step); they run before each module's own hooks, as the per-module ones
        # registered here first did
        self._names = {id(mod): (name, type(mod).__name__) for name, mod in tree.modules}
        self._hooks.append(torch.nn.modules.module.register_module_forward_pre_hook(self._push_hook))
        self._hooks.append(torch.nn.modules.module.register_module_forward_hook(self._pop_hook))

    # --- module ownership -------------------------------------------------------------------------
    def _push_hook(self, module, args):
        entry = self._names.get(id(module))
        if entry is not None:         # a module of the traced model
            self._stack.append(entry)
            self.modules.append(module)

    def _pop_hook(self, module, args, output):
        if id(module) in self._names:
            self._stack.pop()
            self.modules.pop()

    def close(self):
        for h in self._hooks:
            h.remove()

    @property
    def module(self) -> tuple[str, str]:
        return self._stack[-1]

    @contextlib.contextmanager
    def role(self, role: str):
        """GEMMs inside multiply their weights as `role` (e.g. MLA's absorbed kv_b_proj halves)."""
        saved, self.weight_role = self.weight_role, role
        try:
            yield
        finally:
            self.weight_role = saved

    @contextlib.contextmanager
    def suppressed(self):
        """Run HF bookkeeping whose ops are not work a serving engine does (e.g. cache concatenation)."""
        self._suppress += 1
        try:
            yield
        finally:
            self._suppress -= 1

    # --- recording ---------------------------------------------------------------------------------
    def _reads(self, tensors, op_class: str) -> tuple[list, float, float, str | None]:
        """(reads, bytes, weight bytes, operand): operand is "param" or "buffer" when the op reads one (or a view
        or cast of one)."""
        reads, total, weights, seen, operand = [], 0.0, 0.0, set(), None
        self._last_roots = []
        for t in tensors:
            if id(t) in seen:
                continue
            seen.add(id(t))
            nbytes = tensor_bytes(t)
            producer = self._producer.get(t)
            if producer == "param" or t in self._params:
                weights += nbytes
                producer = None
            root = self._weight_of.get(t)
            if root is not None:
                if root in self._buffers:
                    operand = operand or "buffer"
                else:
                    operand = "param"
                    self.params_read.setdefault(id(root), set()).add(op_class)
                    self._last_roots.append(root)
            reads.append((producer, nbytes))
            total += nbytes
        return reads, total, weights, operand

    def _new_raw(self, name, op_class, unit, flops, dtype, shapes, out_shape, **kw) -> _Raw:
        path, mtype = self.module
        m = self._layer_re.match(path)
        layer = int(m.group(1)) if m else None
        return _Raw(name=name, op_class=op_class, unit=unit, flops=flops, dtype=dtype, module=path,
                    module_type=mtype, layer=layer, shapes=shapes, out_shape=out_shape,
                    fusion_group=_fusion_group(name, op_class, mtype), tp_sharded=_tp_sharded(path, mtype), **kw)

    def _append(self, raw: _Raw, outputs) -> None:
        index = len(self.ops)
        for producer, _ in raw.reads:
            if producer is not None:
                self.ops[producer].consumers.add(index)
        self.ops.append(raw)
        for t in outputs:
            self._producer[t] = index

    def record(self, name: str, op_class: str, unit: str, flops: float, inputs, outputs, *,
               bytes_read: float | None = None, bytes_written: float | None = None, weight_bytes: float | None = None,
               attention: AttentionWork | None = None, experts: ExpertsWork | None = None,
               gemm: GemmShape | None = None, kv_cache_write: bool = False, state: StateWork | None = None) -> None:
        """Record one op that tracecost prices itself (attention core, routed experts, KV write)."""
        if self._suppress:
            return
        inputs = [t for t in inputs if isinstance(t, torch.Tensor)]
        outputs = [t for t in outputs if isinstance(t, torch.Tensor)]
        reads, read_total, weights, operand = self._reads(inputs, op_class)
        if experts is not None:
            for root in self._last_roots:
                self.mark_expert_weight(root, experts.top_k, experts.num_experts)
        raw = self._new_raw(name, op_class, "matrix" if op_class != OTHER else "vector", flops,
                            dtype_name(inputs[0].dtype) if inputs else "bf16",
                            tuple(tuple(t.shape) for t in inputs), tuple(outputs[0].shape) if outputs else (),
                            reads=reads, attention=attention, experts=experts, gemm=gemm,
                            kv_cache_write=kv_cache_write, state=state, operand=operand)
        raw.bytes_read = read_total if bytes_read is None else bytes_read
        raw.bytes_written = sum(tensor_bytes(t) for t in outputs) if bytes_written is None else bytes_written
        raw.weight_bytes = weights if weight_bytes is None else weight_bytes
        raw.fusion_group = None
        if experts is not None:
            raw.weight_module = raw.module
        self._append(raw, outputs)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = op_formulas.op_base_name(func)
        if name in ("_grouped_mm", "grouped_mm") and self.pending_experts is not None:
            # the experts op stands for this GEMM, so only its shape is needed; torch's meta kernel would also
            # refuse anything but bf16 (fp16 and fp32 traces failed here)
            a, b = args[0], args[1]
            out = a.new_empty(a.shape[0], b.shape[-1])
            if not self._suppress:
                self._record_experts(args, [out])
            return out
        out = func(*args, **kwargs)
        if self._suppress:
            return out
        flat_out = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if op_formulas.is_view(func):
            flat_in = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
            if flat_in:
                src = flat_in[0]
                producer = "param" if src in self._params else self._producer.get(src)
                root = self._weight_of.get(src)
                for t in flat_out:
                    if producer is not None:
                        self._producer[t] = producer
                    if root is not None:
                        self._weight_of[t] = root
                self.inline.follow_view(src, flat_out)
            return out
        if name in op_formulas.FREE or name.startswith("_local_scalar"):
            return out
        work = op_formulas.work_for(func, args, kwargs, out)
        if work is None:
            self.unformulated[name] = self.unformulated.get(name, 0) + 1
            return out
        flat_in = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        writes_first_arg = bool(func._schema.arguments) and func._schema.arguments[0].alias_info is not None \
            and func._schema.arguments[0].alias_info.is_write
        if writes_first_arg and name in ("copy_", "fill_", "zero_", "index_put_", "masked_fill_", "slice_scatter"):
            flat_in = flat_in[1:]  # the destination is written, not read
        reads, read_total, weights, operand = self._reads(flat_in, work.op_class)
        if name in _BIAS_FIRST and args and isinstance(args[0], torch.Tensor):  # the added bias is not multiplied
            bias = self._weight_of.get(args[0])
            if bias is not None and bias in self._params:
                classes = self.params_read.setdefault(id(bias), set())
                classes.discard(GEMM)
                classes.add(OTHER)
                self._last_roots = [r for r in self._last_roots if r is not bias]
        if self.inline.handle(work.op_class, operand, flat_in, flat_out):
            return out
        if work.op_class == GEMM and len(self._last_roots) == 1:  # rows this weight met: FLOPs / (2 x its size)
            root = self._last_roots[0]
            self.param_rows.setdefault(id(root), []).append(work.flops / (2.0 * max(1, root.numel())))
        if name in _CASTS and flat_in and flat_in[0] in self._weight_of:  # a cast weight is still that weight
            for t in flat_out:
                self._weight_of[t] = self._weight_of[flat_in[0]]
        if work.bytes_read is not None:
            read_total = work.bytes_read
        dtype = next((t.dtype for t in flat_out + flat_in if t.is_floating_point()), flat_out[0].dtype if flat_out
                     else torch.float32)
        raw = self._new_raw("aten." + name, work.op_class, work.unit, work.flops, dtype_name(dtype),
                            tuple(tuple(t.shape) for t in flat_in), tuple(flat_out[0].shape) if flat_out else (),
                            reads=reads, gemm=work.gemm, operand=operand)
        if work.op_class == GEMM and self._last_roots:
            raw.weight_module = self._owner.get(self._last_roots[0])
            raw.weight_role = self.weight_role
        raw.bytes_read = read_total
        raw.bytes_written = sum(tensor_bytes(t) for t in flat_out)
        raw.weight_bytes = weights
        if flat_out and work.op_class == OTHER:
            out_numel = flat_out[0].numel()
            raw.broadcast = any(1 < t.numel() < out_numel for t in flat_in) and name not in op_formulas.REDUCTIONS
        self._append(raw, flat_out)
        return out

    def mark_expert_weight(self, weight, top_k: int, num_experts: int) -> None:
        """A routed-experts op read this weight (once more): the FLOP identity expects top_k / E of the tokens."""
        uses = self.expert_params.get(id(weight), (0, 0, 0))[2]
        self.expert_params[id(weight)] = (top_k, num_experts, uses + 1)

    def _record_experts(self, args, outputs) -> None:
        """HF's expert GEMMs: the first becomes the layer's expected-work op, the second is part of it."""
        pending = self.pending_experts
        for weight in args[1:2]:  # the experts' weights: read by this layer's experts op
            root = self._weight_of.get(weight)
            if root is not None:
                self.params_read.setdefault(id(root), set()).add(GEMM)
                self.mark_expert_weight(root, pending.work.top_k, pending.work.num_experts)
        if getattr(pending, "recorded", False):
            for t in outputs:  # the down projection: its output comes from the experts op
                self._producer[t] = len(self.ops) - 1
            return
        inputs = [a for a in args[:1] if isinstance(a, torch.Tensor)]
        self.record("tracecost.moe_experts", GEMM, "matrix", pending.flops, inputs, outputs,
                    bytes_read=pending.bytes_read, bytes_written=pending.bytes_written,
                    weight_bytes=pending.weight_bytes, experts=pending.work, gemm=pending.gemm)
        pending.recorded = True

    def __enter__(self):
        _ACTIVE.append(self)
        return super().__enter__()

    def __exit__(self, *exc):
        _ACTIVE.pop()
        return super().__exit__(*exc)

    # --- result ------------------------------------------------------------------------------------
    def _fused_kernels(self) -> list[list[int]]:
        """Group fusable ops into the kernels an engine runs. Inside an attention or MLP block, all ops of one
        fusion group are one kernel even when a GEMM sits between them (the engine merges those GEMMs: gate/up,
        q/k/v); elsewhere a kernel is a run of adjacent fusable ops in one layer (residual add + next norm)."""
        blocks: dict[tuple, list[int]] = {}
        kernels: list[list[int]] = []
        current: list[int] = []
        scope = None
        for i, raw in enumerate(self.ops):
            if raw.fusion_group is None:
                if current:
                    kernels.append(current)
                current, scope = [], None
                continue
            block = self._block_re.match(raw.module)
            if block is not None:
                key = (block.group(1), raw.fusion_group)
                if key not in blocks:
                    blocks[key] = []
                    kernels.append(blocks[key])
                blocks[key].append(i)
                continue
            this_scope = (raw.layer, raw.module if raw.layer is None else None)
            if current and this_scope != scope:
                kernels.append(current)
                current = []
            current.append(i)
            scope = this_scope
        if current:
            kernels.append(current)
        return kernels

    def finish(self) -> list[Op]:
        """Freeze ops, pricing each fused kernel by the bytes that cross its boundary."""
        kernels = self._fused_kernels()

        fused: dict[int, tuple[float, str]] = {}
        for k, members in enumerate(kernels):
            inside = set(members)
            reads = {}
            writes = 0.0
            for i in members:
                raw = self.ops[i]
                for j, (producer, nbytes) in enumerate(raw.reads):
                    if producer not in inside:
                        reads[(producer, i, j) if producer is None else (producer, nbytes)] = nbytes
                if not raw.consumers or raw.consumers - inside:
                    if not raw.consumers and i != members[-1]:
                        continue
                    writes += raw.bytes_written
            total = sum(reads.values()) + writes
            # charge the kernel's bytes to its first op; the rest ride along for free
            key = f"k{k}"
            for n, i in enumerate(members):
                fused[i] = (total if n == 0 else 0.0, key)

        ops = []
        for i, raw in enumerate(self.ops):
            fb, key = fused.get(i, (None, None))
            ops.append(Op(name=raw.name, op_class=raw.op_class, unit=raw.unit, flops=raw.flops,
                          bytes_read=raw.bytes_read, bytes_written=raw.bytes_written, dtype=raw.dtype,
                          module=raw.module, module_type=raw.module_type, shapes=raw.shapes, out_shape=raw.out_shape,
                          layer=raw.layer, fusion_group=raw.fusion_group, weight_bytes=raw.weight_bytes,
                          tp_sharded=raw.tp_sharded, gemm=raw.gemm, attention=raw.attention, experts=raw.experts,
                          state=raw.state, weight_operand=raw.operand, weight_module=raw.weight_module,
                          weight_role=raw.weight_role, fused_bytes=fb, fusion_key=key, kv_cache_write=raw.kv_cache_write, broadcast=raw.broadcast,
                          source=next((p for p, _ in raw.reads if p is not None), None)))
        return ops

