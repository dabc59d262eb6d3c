"""The checkpoint's weight format for each weight a step multiplies, read from the config's quantization_config.

A checkpoint quantizes its linear layers (and routed experts) in one format and leaves named modules alone:
- fp8 (HF FineGrainedFP8, vLLM Fp8Config): `weight_block_size` -> fp8_block, else per-tensor fp8;
  `ignored_layers` / `modules_to_not_convert` stay unquantized.
- compressed-tensors: `config_groups`, each with `targets` (a class such as "Linear", a module name, or a
  "re:" regex) and a `weights` scheme; `ignore` stays unquantized.
- mxfp4 (gpt-oss): the routed experts; `modules_to_not_convert` names attention, router, embeddings, lm_head.
- awq / gptq / bitsandbytes / ...: `bits`, `modules_to_not_convert`; GPTQ's `lm_head: true` quantizes lm_head.
The output embedding (lm_head) stays unquantized unless the config names it: transformers keeps it out of
every quantizer (quantizers/base.py get_modules_to_not_convert -> get_keys_to_not_convert), and vLLM's
ParallelLMHead is not a LinearBase, so only configs with an lm_head switch (GPTQ, AWQ-Marlin) quantize it.

This is what the checkpoint says, device and engine independent. Which format an engine then *runs* an op in
(unquantized router gates, MLA's absorbed bmm, weight-only formats on devices without the matrix type) is the
cost model's business (cost/op_formats.py).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

# what a weight is to the model; engines keep per-role rules (cost/engine_formats.json)
LINEAR, EXPERTS, ROUTER, LM_HEAD, MLA_ABSORBED = "linear", "experts", "router", "lm_head", "mla_absorbed"
WEIGHT_ROLES = (LINEAR, EXPERTS, ROUTER, LM_HEAD, MLA_ABSORBED)

_FP8_METHODS = ("fp8", "fbgemm_fp8", "finegrained_fp8")
_INT_METHODS = ("awq", "gptq", "autoround", "hqq", "bitsandbytes", "quanto", "auto-round", "gptq_marlin",
                "awq_marlin")


def matches(pattern: str, module: str) -> bool:
    """A skip/target pattern against a module path: "re:" regexes as compressed-tensors writes them (re.match),
    else a dotted name or glob ("model.layers.*.self_attn") naming the module, one of its parents, or a suffix
    of its path ("lm_head", "mlp.gate"), as vLLM's is_layer_skipped and transformers' modules_to_not_convert do."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], module) is not None
    body = "[^.]+".join(re.escape(part) for part in pattern.strip(".").split("*"))
    return re.fullmatch(rf"(?:.*\.)?{body}(?:\..*)?", module) is not None


@dataclass(frozen=True)
class FormatGroup:
    """Weights matching `targets` are stored in `format` (a compressed-tensors config group, or the whole
    checkpoint for single-format methods, whose target is every linear layer)."""
    format: str
    targets: tuple[str, ...] = ("Linear",)


@dataclass(frozen=True)
class CheckpointFormats:
    """Per-module weight formats of one checkpoint."""
    method: str                       # quant_method, or "override" for --dtype
    groups: tuple[FormatGroup, ...]   # first match wins
    ignored: tuple[str, ...] = ()     # module patterns kept unquantized
    lm_head: bool = False             # the config quantizes lm_head (GPTQ `lm_head: true`, or named in targets)
    experts_only: bool = False        # mxfp4: only routed experts are quantized

    @property
    def headline(self) -> str:
        """The format most weights are in (a class-targeted group's, else the first): what `--dtype auto` reports."""
        return next((g.format for g in self.groups if set(g.targets) & set(LAYER_CLASSES)), self.groups[0].format)

    def format_of(self, module: str, role: str, unquantized: str = "bf16") -> str:
        """The stored format of the weight that `module` (its owner) holds, multiplied as `role`."""
        if role == LM_HEAD and not self.lm_head:
            return unquantized
        if any(matches(p, module) for p in self.ignored):
            return unquantized
        if self.experts_only and role != EXPERTS:
            return unquantized
        # compressed-tensors (vLLM compressed_tensors.py find_matched_target): a target naming the layer, or a
        # regex, wins over a layer class
        for by_class in (False, True):
            for group in self.groups:
                if any((t in LAYER_CLASSES) == by_class and (by_class or matches(t, module)) for t in group.targets):
                    return group.format
        return unquantized


# compressed-tensors class targets: every linear layer, routed experts included (the checkpoint stores each
# expert as Linear layers)
LAYER_CLASSES = ("Linear", "nn.Linear", "torch.nn.Linear")


def _scheme_format(weights: dict, activations) -> str | None:
    """A compressed-tensors weight scheme -> tracecost format; integer weights without input_activations are
    weight-only (W8A16, W4A16)."""
    bits, kind = weights.get("num_bits"), str(weights.get("type", "int")).lower()
    if kind == "float" and bits == 8:
        return "fp8_block" if str(weights.get("strategy", "")).lower() == "block" else "fp8"
    if kind == "float" and bits == 4:
        return "fp4"
    if bits == 4:
        return "int4"
    if bits == 8:
        return "int8" if isinstance(activations, dict) else "int8_wo"
    return None


def _compressed_tensors(q: dict) -> CheckpointFormats | None:
    groups, lm_head = [], False
    for group in (q.get("config_groups") or {}).values():
        if not isinstance(group, dict) or not isinstance(group.get("weights"), dict):
            continue
        fmt = _scheme_format(group["weights"], group.get("input_activations"))
        if fmt is None:
            continue
        targets = tuple(str(t) for t in group.get("targets") or ("Linear",))
        lm_head = lm_head or any(t not in LAYER_CLASSES and matches(t, "lm_head") for t in targets)
        groups.append(FormatGroup(fmt, targets))
    if not groups:
        return None
    return CheckpointFormats("compressed-tensors", tuple(groups), tuple(str(p) for p in q.get("ignore") or ()),
                             lm_head=lm_head)


def _quantization_config(config: dict) -> dict | None:
    q = config.get("quantization_config") or (config.get("text_config") or {}).get("quantization_config")
    return q if isinstance(q, dict) else None


def checkpoint_formats(config: dict) -> CheckpointFormats | None:
    """The checkpoint's formats, or None for an unquantized (or unrecognised) config."""
    q = _quantization_config(config)
    if q is None:
        return None
    method = str(q.get("quant_method", "")).lower()
    skipped = tuple(str(p) for p in (q.get("ignored_layers") or q.get("modules_to_not_convert")
                                     or q.get("ignore") or ()))
    if method == "compressed-tensors":
        return _compressed_tensors(q)
    if method in _FP8_METHODS or "fp8" in str(q.get("fmt", "")).lower():
        fmt = "fp8_block" if q.get("weight_block_size") else "fp8"
        return CheckpointFormats(method, (FormatGroup(fmt),), skipped)
    if method in ("nvfp4", "fp4", "modelopt_fp4"):
        return CheckpointFormats(method, (FormatGroup("fp4"),), skipped)
    if method == "mxfp4":   # vLLM mxfp4.py: Mxfp4MoEMethod for the FusedMoE layers, linear layers unquantized
        return CheckpointFormats(method, (FormatGroup("mxfp4"),), skipped, experts_only=True)
    if method in _INT_METHODS:
        bits = q.get("bits") or q.get("w_bit") or q.get("weight_bits")
        if method == "bitsandbytes" and not bits:
            bits = 4 if q.get("load_in_4bit") else 8 if q.get("load_in_8bit") else None
        # GPTQ / AWQ / bitsandbytes keep activations in bf16: weight-only at 4 and 8 bits (Marlin, W8A16)
        fmt = {4: "int4", 8: "int8_wo"}.get(int(bits)) if bits else None
        if fmt is None:
            return None
        return CheckpointFormats(method, (FormatGroup(fmt),), skipped + tuple(q.get("llm_int8_skip_modules") or ()),
                                 lm_head=bool(q.get("lm_head")))
    return None


def uniform_formats(fmt: str) -> CheckpointFormats:
    """`--dtype FMT` on any config: every linear layer in FMT, lm_head unquantized (as an engine's online
    quantization does: vLLM `--quantization fp8` leaves ParallelLMHead alone)."""
    return CheckpointFormats("override", (FormatGroup(fmt),))


def weight_role(op, routers: set[int], lm_head: str | None) -> str:
    """What a weight GEMM's weight is: a recorded role (MLA absorption) first, then by structure."""
    if op.experts is not None:
        return EXPERTS
    if op.weight_role is not None:
        return op.weight_role
    if lm_head is not None and op.module == lm_head:
        return LM_HEAD
    return ROUTER if id(op) in routers else LINEAR


def _routers(ops) -> set[int]:
    """GEMMs that score a layer's experts: in an MoE block, one output per expert (DeepSeek's `gate`, Qwen's
    `mlp.gate`, gpt-oss's `mlp.router`)."""
    blocks = {(op.layer, op.module.rsplit(".", 1)[0]): op.experts.num_experts for op in ops if op.experts is not None}
    found = set()
    for op in ops:
        if op.op_class != "gemm" or op.experts is not None or op.gemm is None or op.weight_module is None:
            continue
        for (layer, block), experts in blocks.items():
            if op.layer == layer and op.gemm.n == experts and op.weight_module.startswith(block + "."):
                found.add(id(op))
    return found


def assign_formats(ops, formats: CheckpointFormats | None, layer_path: str, groups: list[list[int]],
                   lm_head: str | None, unquantized: str) -> list:
    """Each weight-multiplying op with its role and the checkpoint's format, repeated layers multiplied: an op of
    a traced layer stands for every layer of its group, split where a layer's module is stored in another
    format (an ignore list naming single layers)."""
    members = {group[0]: group for group in groups}
    routers = _routers(ops)
    out = []
    for op in ops:
        group = members.get(op.layer, [op.layer]) if op.layer is not None else [None]
        if op.op_class != "gemm" or (op.weight_operand != "param" and op.experts is None):
            out.append(op.times(len(group)) if op.layer is not None else op)
            continue
        role = weight_role(op, routers, lm_head)
        owner = op.module if role == LM_HEAD else (op.weight_module or op.module)
        counts: dict[str, int] = {}
        for layer in group:
            path = owner if layer is None else re.sub(rf"^{re.escape(layer_path)}\.{op.layer}(?=\.|$)",
                                                      f"{layer_path}.{layer}", owner)
            fmt = formats.format_of(path, role, unquantized) if formats is not None else unquantized
            counts[fmt] = counts.get(fmt, 0) + 1
        out += [replace(op.times(n), weight_role=role, weight_format=fmt) for fmt, n in counts.items()]
    return out


def role_formats(ops) -> dict[str, dict[str, int]]:
    """role -> format -> weight-multiplying ops of the step (layers counted) stored in it."""
    table: dict[str, dict[str, int]] = {}
    for op in ops:
        if op.weight_format is not None and op.weight_role is not None:
            row = table.setdefault(op.weight_role, {})
            row[op.weight_format] = row.get(op.weight_format, 0) + op.count
    return table


def formats_summary(ops) -> str:
    """One line: the checkpoint's format of each kind of weight (device and engine independent)."""
    parts = [f"{role} " + "/".join(f"{fmt} x{n}" for fmt, n in fmts.items())
             for role, fmts in role_formats(ops).items()]
    return "checkpoint weight formats (ops per step): " + ", ".join(parts)
