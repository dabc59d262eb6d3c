"""python -m tracer MODEL: the work of one forward step, per op class and per module."""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict

from .cli_io import dumps_strict, quiet_broken_pipe
from .config_checks import model_dims
from .model_source import ModelError, ModelSpec, bundled_models, resolve_model
from .table import format_table, human
from .weight_formats import role_formats
from .work import OP_CLASSES, Request, Trace, TraceOptions


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line and exits 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", default="auto",
                   choices=["auto", "bf16", "fp16", "fp32", "fp8", "fp8_block", "int8", "int8_wo", "int4", "fp4", "mxfp4"],
                   help="weight dtype; auto (default): each module in the format the config's quantization_config "
                        "gives it (its ignore lists kept), else bf16; a format given here applies to every linear "
                        "layer (lm_head stays bf16). fp8 (per-tensor scales), fp8_block (128x128 block scales), "
                        "int8 and fp4 GEMMs run at that precision where the device has it, weight-only (bf16 math) "
                        "where it does not; int4 and int8_wo (W4A16, W8A16: GPTQ, AWQ) weights are always dequantized "
                        "to bf16")
    p.add_argument("--kv-cache-dtype", default=None, choices=["bf16", "fp16", "fp32", "fp8", "int8"],
                   help="KV cache dtype (default: the model dtype)")
    p.add_argument("--mla-form", default="auto", choices=["auto", "absorbed", "hf"],
                   help="DeepSeek MLA: absorbed latent attention as engines run it, or HF's re-expansion; auto "
                        "(default): hf for --execution eager, absorbed otherwise")
    p.add_argument("--moe-imbalance", type=float, default=1.0,
                   help="tokens on the busiest expert relative to balanced routing (default 1.0)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow fetching and running a model's own remote code")
    p.add_argument("--revision", default=None,
                   help="Hugging Face Hub ids: branch, tag or commit of config.json (default: main)")
    p.add_argument("--image-tokens", type=int, default=0, metavar="N",
                   help="vision-language models: N image tokens per sequence, counted as prefill input through the "
                        "language model, plus the vision encoder's work for them where it can be run (default 0)")


def model_spec(args) -> ModelSpec:
    """The model a command's MODEL, --revision and --trust-remote-code name."""
    return resolve_model(args.model, revision=args.revision, trust_remote_code=args.trust_remote_code)


def trace_options(args) -> TraceOptions:
    if not 1.0 <= args.moe_imbalance <= 1e3:   # also NaN
        raise ValueError(f"--moe-imbalance must be in [1, 1000], got {args.moe_imbalance}")
    if getattr(args, "image_tokens", 0) < 0:
        raise ValueError("--image-tokens must be >= 0")
    mla_form = args.mla_form
    if mla_form == "auto":  # eager execution means HF's own code path
        mla_form = "hf" if getattr(args, "execution", "engine") == "eager" else "absorbed"
    args.mla_form = mla_form
    return TraceOptions(dtype=args.dtype, kv_cache_dtype=args.kv_cache_dtype, mla_form=mla_form,
                        moe_imbalance=args.moe_imbalance, trust_remote_code=args.trust_remote_code,
                        dedup_layers=not getattr(args, "no_dedup", False), image_tokens=getattr(args, "image_tokens", 0))


def trace_summary(t: Trace) -> dict:
    return {
        "model": t.model,
        "request": {"num_queries": t.request.num_queries, "query_length": t.request.query_length,
                    "context_length": t.request.context_length, "decode": t.request.decode},
        "architecture": t.architecture, "params": t.params, "active_params": t.active_params,
        "flops": t.flops, "flops_by_class": t.flops_by_class(),
        "bytes": t.bytes, "bytes_by_class": t.bytes_by_class(),
        "num_ops": t.num_ops, "trace_seconds": round(t.trace_seconds, 4),
        "kv_cache_bytes_per_token": t.kv_bytes_per_token, "weight_bytes": t.weight_bytes,
        "unformulated_ops": t.unformulated, "notes": t.notes, "checks": t.checks,
        "state_bytes_per_sequence": t.state_bytes_per_sequence, "image_tokens": t.image_tokens,
        "weight_formats": role_formats(t.ops),   # role -> checkpoint format -> weight GEMMs per step
    }


def by_module(t: Trace) -> list[list]:
    groups: dict[tuple, list] = defaultdict(lambda: [0, 0.0, 0.0])
    for op in t.ops:
        g = groups[(op.module_type, op.op_class)]
        g[0] += op.count
        g[1] += op.flops * op.count
        g[2] += op.bytes * op.count
    rows = sorted(groups.items(), key=lambda kv: -kv[1][1] - kv[1][2] * 1e-3)
    return [[mt, cls, n, human(f, "FLOP"), human(b, "B")] for (mt, cls), (n, f, b) in rows]


def render(t: Trace) -> str:
    r = t.request
    head = (f"{t.model}: {'decode' if r.decode else 'prefill'}  batch={r.num_queries} query={r.query_length} "
            f"context={r.context_length}  params={human(t.params)} active={human(t.active_params)}  "
            f"traced in {t.trace_seconds:.2f}s")
    fl, by = t.flops_by_class(), t.bytes_by_class()
    classes = format_table(["class", "FLOPs", "bytes", "share of FLOPs"],
                           [[c, human(fl[c], "FLOP"), human(by[c], "B"), f"{fl[c] / max(t.flops, 1) * 100:.1f}%"]
                            for c in OP_CLASSES] + [["total", human(t.flops, "FLOP"), human(t.bytes, "B"), "100%"]])
    modules = format_table(["module", "class", "ops", "FLOPs", "bytes"], by_module(t))
    notes = "".join(f"\nnote: {n}" for n in t.notes)
    if t.unformulated:
        notes += f"\nwarning: ops without a formula (not counted): {t.unformulated}"
    return f"{head}\n\n{classes}\n\n{modules}{notes}"


def crosscheck_table(t: Trace, formula: dict) -> str:
    traced = t.flops_by_class()
    rows = [[c, human(traced[c], "FLOP"), human(formula[c], "FLOP"), f"{(traced[c] / formula[c] - 1) * 100:+.3f}%"]
            for c in formula]
    total_formula = sum(formula.values())
    rows.append(["matrix total", human(traced["gemm"] + traced["attention"], "FLOP"), human(total_formula, "FLOP"),
                 f"{((traced['gemm'] + traced['attention']) / total_formula - 1) * 100:+.3f}%"])
    return format_table(["class", "traced", "formula", "difference"], rows, title="cross-check: tracer vs formulas")


def context_warnings(spec: ModelSpec, request: Request) -> list[str]:
    """A sequence longer than the model was trained for is traced as asked, with a warning saying so."""
    longest = model_dims(spec.config, spec.name).max_context
    length = request.context_length + request.query_length
    if longest is None or length <= longest:
        return []
    return [f"{length:,} tokens (context + query) exceed {spec.name}'s maximum context of {longest:,} "
            f"(max_position_embeddings, rope scaling considered): the model was not trained for it; traced as if "
            f"it ran"]


def list_models() -> str:
    return format_table(["name", "family", "source"],
                        [[m.name, m.family, m.source] for m in bundled_models().values()])


@quiet_broken_pipe
def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m tracer", description=__doc__)
    p.add_argument("model", nargs="?", help="bundled name, folder or config.json path, or Hugging Face Hub id")
    p.add_argument("--list", action="store_true", help="list the bundled models")
    p.add_argument("--num-queries", "-b", type=int, default=1, help="sequences in the batch (default 1)")
    p.add_argument("--query-length", "-q", type=int, default=None, help="new tokens per sequence (default 2048)")
    p.add_argument("--context-length", "-c", type=int, default=0, help="tokens already in the KV cache")
    p.add_argument("--decode", action="store_true", help="one decode step (query length 1)")
    p.add_argument("--all-logits", action="store_true", help="compute logits for every token, not just the last")
    p.add_argument("--no-dedup", action="store_true", help="trace every decoder layer instead of one per kind")
    p.add_argument("--crosscheck", action="store_true", help="print traced vs hand-written formula FLOPs")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    add_model_arguments(p)
    args = p.parse_args(argv)
    if args.list:
        print(list_models())
        return 0
    if not args.model:
        p.error("MODEL is required (or --list)")
    if args.decode and args.query_length not in (None, 1):
        p.error("--decode takes query length 1")
    query = 1 if args.decode else (args.query_length if args.query_length is not None else 2048)
    try:
        from .trace import trace
        request = Request(args.num_queries, query, args.context_length, decode=args.decode, all_logits=args.all_logits)
        spec = model_spec(args)
        options = trace_options(args)
        t = trace(spec, request, options)
        warnings = context_warnings(spec, request)
    except (ValueError, ModelError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for message in warnings:
        print(f"warning: {message}", file=sys.stderr)
    formula, no_formula = None, None
    if args.crosscheck:
        from .formulas import NoFormula, full_config, model_flops
        try:
            formula = model_flops(full_config(spec), request, args.mla_form)
        except NoFormula as e:
            no_formula = str(e)
    if args.json:
        out = {**trace_summary(t), "warnings": warnings}
        if formula is not None:
            out["formula_flops_by_class"] = formula
        if no_formula is not None:
            out["formula"] = no_formula
        print(dumps_strict(out, indent=1))
    else:
        print(render(t))
        if formula is not None:
            print()
            print(crosscheck_table(t, formula))
        if no_formula is not None:
            print(f"\ncross-check: {no_formula}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
