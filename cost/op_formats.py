"""Each GEMM in the format the engine runs it in.

The trace records how the checkpoint stores each weight (tracer/weight_formats.py: a role and a format per op).
Two things decide how an engine multiplies it:
- the engine's rules per weight role (engine_formats.json, each with the engine source it follows): router
  gates and MLA's absorbed bmm run in bf16 in vLLM and SGLang whatever the checkpoint says;
- the device's matrix units: a format whose matrix type the device lacks (fp8 on Ampere, fp4 on Hopper) runs
  weight-only where the engine has such a path: weights read at their stored width, dequantized inside the
  GEMM, bf16 math (Marlin, triton matmul_ogs). It is priced with the engine's bf16 kernel model at the stored
  weight bytes; 4-bit MoE layers use the engine's int4 weight-only MoE fit where the device has one.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources

from tracer.dtypes import TORCH_DTYPE_NAMES
from tracer.work import GEMM, Op

from .engine_kernels.moe_runners import RunnerChoice, model_runner, moe_key
from .engines import ENGINES
from .execution import ENGINE
from .profile import HardwareProfile, ProfileError

NATIVE, RULE, WEIGHT_ONLY = "native", "engine rule", "weight-only"
# checkpoint format -> (GEMM kernel model, fused-MoE kernel model, matrix type it needs); None: no such kernel,
# always weight-only (W4A16, W8A16: vLLM gptq_marlin / awq_marlin). int8 W8A8 runs the per-tensor fp8 path's kernel models, as before. mxfp4 on
# Blackwell (FlashInfer's MXFP4 MoE) is priced with the nvfp4 models at mxfp4's bytes.
KERNELS = {"bf16": ("bf16", "bf16", "bf16"), "fp8": ("fp8", "fp8", "fp8"), "fp8_block": ("fp8_block", "fp8_block", "fp8"),
           "int8": ("fp8", "fp8", "int8"), "fp4": ("nvfp4", "nvfp4", "fp4"), "mxfp4": ("nvfp4", "nvfp4", "fp4"),
           "int4": (None, "int4", None), "int8_wo": (None, None, None)}
# bytes a stored weight element occupies, scales included where they matter (nvfp4: fp8 scale per 16; mxfp4:
# 8-bit exponent per 32); what a weight-only kernel streams
STORED_BYTES = {"bf16": 2.0, "fp8": 1.0, "fp8_block": 1.0, "int8": 1.0, "fp4": 0.5625, "mxfp4": 0.53125, "int4": 0.5,
                "int8_wo": 1.0}
ROLE_LABELS = {"linear": "linear", "experts": "MoE experts", "router": "router gates", "lm_head": "lm_head",
               "mla_absorbed": "MLA absorbed bmm"}


@dataclass(frozen=True)
class RunFormat:
    """How one GEMM runs: the kernel model that prices it and the weight bytes it streams."""
    kernel: str            # engine kernel model: bf16 | fp8 | fp8_block | nvfp4 | int4 (MoE)
    weight_bytes: float    # per weight element read from HBM
    checkpoint: str        # the checkpoint's format of the weight
    how: str = NATIVE      # native | engine rule | weight-only
    source: str = ""       # the engine source a rule or a weight-only path follows
    # the weight-only kernel against the bf16 one that prices it (engine_formats.json weight_only_kernel): its math
    # stops at this share of the dense bf16 peak (Marlin's 64-row blocks, each dequantizing the weights again),
    # it streams its weights at this share of the bf16 kernel's rate, and it takes this much more per call
    math_peak_fraction: float = 1.0
    stream_fraction: float = 1.0
    call_us: float = 0.0
    resident: float = 1.0  # what the weights occupy in the engine's layout, over their stored bytes
    # weight-only although the device has the format's matrix units: its kernel models (carried over from a donor
    # device) have no fit of the native kernel, so the format is priced as the engines' weight-only path
    unfitted_native: bool = False
    # routed experts the engine runs on another MoE runner than its default one for this model and device
    # (engine_kernels/moe_runners.py), and whether the device has that runner's own kernel model
    runner: RunnerChoice | None = None
    runner_fitted: bool = False

    @property
    def model(self) -> str:
        """The engine calibration's kernel model that prices it: the format's, or its runner's own."""
        return moe_key(self.kernel, self.runner.runner) if self.runner and self.runner_fitted else self.kernel


@lru_cache(maxsize=1)
def engine_rules() -> dict:
    return json.loads((resources.files("cost") / "engine_formats.json").read_text())


def _stored(fmt: str) -> str:
    return "bf16" if fmt in TORCH_DTYPE_NAMES else fmt


def run_format(checkpoint: str, role: str, engine: str, hw: HardwareProfile, moe: bool,
               moe_models: tuple[str, ...] = (), gemm_models: tuple[str, ...] = ()) -> RunFormat:
    """`moe_models`, `gemm_models`: the engine's fused-MoE and GEMM kernel models on this device (a 4-bit
    weight-only MoE layer takes the int4 fit when there is one; a native kernel without a model here runs the
    weight-only path). Empty: not checked."""
    fmt = _stored(checkpoint)
    if fmt not in KERNELS:
        raise ProfileError(f"no engine kernel model for weight format '{checkpoint}' (known: {', '.join(KERNELS)})")
    rules = engine_rules().get(engine, {})
    rule = rules.get("roles", {}).get(role)
    if rule is not None and rule["runs"] == "bf16" and fmt != "bf16":
        return RunFormat("bf16", 2.0, fmt, RULE, rule["source"])
    gemm_kernel, moe_kernel, matrix = KERNELS[fmt]
    kernel = moe_kernel if moe else gemm_kernel
    models = moe_models if moe else gemm_models
    native = kernel is not None and matrix in hw.matrix_tflops
    if native and (not models or kernel in models):
        return RunFormat(kernel, STORED_BYTES[fmt] if fmt == "mxfp4" else _kernel_bytes(kernel), fmt)
    path = rules.get("weight_only", {}).get(fmt)
    if native and path is None:
        raise ProfileError(f"{ENGINES[engine].label}: no {'fused MoE' if moe else 'GEMM'} kernel model for "
                           f"'{kernel}' on {hw.name} (has: {', '.join(models) or 'none'}) and no weight-only path "
                           f"for {fmt} weights to price instead")
    if matrix is not None and path is None:
        has = [ENGINES[e].label for e in ENGINES if fmt in engine_rules().get(e, {}).get("weight_only", {})]
        raise ProfileError(f"{ENGINES[engine].label} has no weight-only path for {fmt} weights on {hw.name}, which "
                           f"has no {matrix} matrix units" + (f" ({', '.join(has)} dequantize them in the GEMM)"
                                                              if has else ""))
    weight_bytes = STORED_BYTES[fmt]
    source = path["source"] if path else ""
    # vLLM runs mxfp4 through triton_kernels on SM90 (a GPU with fp8 units here) and Marlin below it
    # (get_mxfp4_backend); only the layout measured on the former is applied (engine_formats.json `resident`)
    layout = (path or {}).get("resident", {})
    resident = layout.get("fp8_units", 1.0) if "fp8" in hw.matrix_tflops else 1.0
    if moe and weight_bytes <= 0.6 and "int4" in moe_models:
        return RunFormat("int4", weight_bytes, fmt, WEIGHT_ONLY, source, resident=resident, unfitted_native=native)
    k = rules.get("weight_only_kernel", {})      # its per-call cost is the dense GEMM's (fused MoE has its own)
    return RunFormat("bf16", weight_bytes, fmt, WEIGHT_ONLY, source, k.get("math_peak_fraction", 1.0),
                     k.get("stream_fraction", 1.0), 0.0 if moe else k.get("call_us", {}).get(fmt, 0.0), resident,
                     native)


def _kernel_bytes(kernel: str) -> float:
    from .kernel_rows import WEIGHT_FORMATS
    return WEIGHT_FORMATS[kernel][0]


def op_format(op: Op | None, engine: str, hw: HardwareProfile, default: str,
              moe_models: tuple[str, ...] = (), gemm_models: tuple[str, ...] = (), architecture: str = "",
              all_to_all: bool = False, moe_tokens: float | None = None, tp_allreduce: bool = False) -> RunFormat:
    """A GEMM kernel's format. A GEMM of two activations or of a buffer (attention scores, a rotary table) has
    no weight to quantize: bf16. A weight GEMM without a recorded format (an op built by hand) takes `default`.
    Routed experts take the MoE runner the engine picks for the model's `architecture` on this device (without a
    dispatch-style `all_to_all`), for a call of `moe_tokens` tokens a rank and the layout (`tp_allreduce`:
    tensor-parallel, no attention DP) in the release the device's kernels are priced at."""
    reads_weights = op is not None and (op.experts is not None or op.weight_operand == "param"
                                        or (op.weight_operand is None and op.weight_bytes > 0))
    if not reads_weights:
        return RunFormat("bf16", 2.0, "bf16")
    checkpoint = op.weight_format or default
    f = run_format(checkpoint, op.weight_role or ("experts" if op.experts is not None else "linear"), engine, hw,
                   moe=op.experts is not None, moe_models=moe_models, gemm_models=gemm_models)
    if op.experts is None or f.how == WEIGHT_ONLY:
        return f
    choice = model_runner(engine, hw.key, architecture, f.kernel, all_to_all, moe_tokens, tp_allreduce,
                          hw.kernel_release)
    return f if choice is None else replace(f, runner=choice,
                                            runner_fitted=moe_key(f.kernel, choice.runner) in moe_models)


def expert_resident(trace, engine: str, hw: HardwareProfile, execution: str = ENGINE) -> float:
    """What the routed experts of `trace` occupy once the engine has laid them out, over their stored bytes
    (1 for a model without routed experts, a format the engine keeps as stored, or eager execution)."""
    op = next((op for op in trace.ops if op.experts is not None), None)
    if op is None or execution != ENGINE:
        return 1.0
    return op_format(op, engine, hw, trace.options.dtype, tuple(hw.engine(engine).moe)).resident


def formats_note(kernels, formats: list[RunFormat], engine: str, hw: HardwareProfile) -> list[str]:
    """One note naming the per-op formats, one per weight-only format (what it streams, what it computes in);
    each starts with "formats" (`is_formats_note`)."""
    table: dict[tuple, int] = {}
    weight_only: dict[str, RunFormat] = {}
    for k, f in zip(kernels, formats):
        if f is None or k.op_class != GEMM or k.op is None or k.op.weight_role is None:
            continue
        key = (k.op.weight_role, f.model if f.how != WEIGHT_ONLY else f"{f.checkpoint} weight-only", f.how)
        table[key] = table.get(key, 0) + k.count
        if f.how == WEIGHT_ONLY:
            # one note per format: the dense GEMMs' kernel terms (their ceiling) over the experts', and the
            # experts' layout either way
            held = weight_only.get(f.checkpoint)
            if held is None or f.math_peak_fraction < held.math_peak_fraction:
                weight_only[f.checkpoint] = replace(f, resident=max(f.resident, held.resident if held else 1.0))
            elif f.resident > held.resident:
                weight_only[f.checkpoint] = replace(held, resident=f.resident)
    if not table:
        return []
    label = ENGINES[engine].label
    parts = [f"{ROLE_LABELS.get(role, role)} {kernel} x{n}" + (f" ({label} rule)" if how == RULE else "")
             for (role, kernel, how), n in table.items()]
    notes = [f"formats ({label} on {hw.name}, kernels per step): " + ", ".join(parts)]
    for f in dict.fromkeys(f for f in formats if f is not None and f.runner is not None):
        priced = (f"priced with that runner's own kernel model (moe.{f.model})" if f.runner_fitted else
                  f"{hw.name} has no kernel model of that runner, so it is priced with the default runner's "
                  f"(moe.{f.kernel}), which can be 2x off at large token counts")
        when = f" {f.runner.when}" if f.runner.when else ""
        notes.append(f"formats: routed experts run on {f.runner.label}, which it picks for "
                     f"{f.runner.architecture} on {hw.name}{when} ({f.runner.source_file}); {priced}")
    for fmt, f in weight_only.items():
        lacks = f", which has no {KERNELS[fmt][2]} matrix units" if KERNELS[fmt][2] else ""
        if f.unfitted_native:
            lacks = (f", which has {KERNELS[fmt][2]} matrix units but no fit of {label}'s native {fmt} kernel "
                     f"among its kernel models (carried over from another device): slower than the native "
                     f"kernel would run")
        width = f"{f.weight_bytes:g} byte" + ("" if f.weight_bytes == 1 else "s")
        notes.append(f"formats: {fmt} weights run weight-only on {hw.name}{lacks}: read at {width} a weight, "
                     f"dequantized in the GEMM, bf16 math; priced with "
                     f"{label}'s bf16 kernel models" + (" (int4 weight-only MoE fit for the experts)"
                                                         if any(g.kernel == "int4" for g in formats if g) else "")
                     + _ceiling_note(f, engine, hw)
                     + (f"; held at {f.resident:g}x their stored bytes in {label}'s layout for its kernel "
                        f"(its load logs, cost/engine_formats.json)" if f.resident != 1.0 else "")
                     + (f"; {f.source.split(':')[0]}" if f.source else ""))
    return notes


def _ceiling_note(f: RunFormat, engine: str, hw: HardwareProfile) -> str:
    parts = []
    if f.math_peak_fraction < 1.0:
        parts.append(f"its math capped at {f.math_peak_fraction:g} of the bf16 peak from 64 rows")
    if f.stream_fraction < 1.0:
        parts.append(f"its weights read at {f.stream_fraction:g} of the bf16 kernel's rate")
    if f.call_us > 0.0:
        parts.append(f"{f.call_us:g} us more per call")
    if not parts:
        return ""
    k = engine_rules()[engine]["weight_only_kernel"]
    where = "measured on this GPU" if hw.key == k["measured_on"] else f"as measured on {k['measured_on']}"
    return f", {', '.join(parts)} ({k['name']}, {where}: cost/engine_formats.json)"


def is_formats_note(note: str) -> bool:
    """A note on the formats and kernels a step runs: the per-op formats, a GEMM / MoE format's kernel model taken
    from another fit (cost/estimate.py, "vLLM kernels: moe.fp8 from the NVIDIA H200 SXM fit (...)"), or an
    attention the engine runs on another kernel than its fitted one ("vLLM kernels: attention with sink logits",
    "... MLA prefill in the expanded multi-head form")."""
    return note.startswith("formats") or re.match(r"^[\w.-]+ kernels: ((gemm|moe)\.\w+ from |attention with sink "
                                                  r"logits |MLA prefill in )", note) is not None
