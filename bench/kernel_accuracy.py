"""Engine kernel accuracy against the published kernel tables, on rows the calibration never saw.

    pip install 'tracecost[calibrate]'  &&  pip download --no-deps aiconfigurator-core==0.12.0
    python bench/kernel_accuracy.py --kernel-db aiconfigurator_core-0.12.0-*.whl [--systems h100_sxm,...]
        [--engine vllm] [--refit] [--json]

For each system the engine calibration is the bundled profile's (fitted on a seeded half of every table,
seed 0), or refitted here with --refit. Every table row is predicted; the report gives, per device, kernel
model and regime, the median, p90 and max absolute error and the signed median on the held-out half, the
"before" numbers of the previous model (HF-eager efficiencies carried over to engine kernels), and the
done-criteria check over every row.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cli.common import run_main  # noqa: E402
from cost.calibrate_engine import SYSTEM_PROFILES, calibrate, split, system_list  # noqa: E402
from cost.engines import DEFAULT_ENGINE, ENGINES  # noqa: E402
from cost.kernel_db import load_tables, table_systems, without_impossible_rows  # noqa: E402
from cost.engine_kernels.moe_runners import moe_key  # noqa: E402
from cost.kernel_rows import AllreduceRow, AttentionRow, GemmRow, MoeRow, group_rows, price_group  # noqa: E402
from cost.kernels import attention_time, experts_time, gemm_time  # noqa: E402
from cost.parallel import all_reduce_seconds  # noqa: E402
from cost.profile import ProfileError, load_profile  # noqa: E402
from tracer.attention import attention_bytes, attention_flops, attention_work  # noqa: E402
from tracer.work import ExpertsWork, GemmShape  # noqa: E402
from tracer.experts import expected_active_experts, experts_flops  # noqa: E402

_LEGACY_DTYPE = {"bf16": "bf16", "fp8": "fp8", "fp8_block": "fp8", "nvfp4": "fp4", "int4": "bf16"}
_WEIGHT_BYTES = {"bf16": 2.0, "fp8": 1.0, "fp8_block": 1.0, "nvfp4": 0.5, "int4": 0.5}


def legacy_seconds(row, hw) -> float:
    """The previous engine pricing: HF-eager-fitted formulas (cost/kernels.py) carried over to engine kernels."""
    if isinstance(row, GemmRow):
        wb = _WEIGHT_BYTES[row.dtype]
        nbytes = row.m * row.k * 2 + row.n * row.k * wb + row.m * row.n * 2
        return gemm_time(2.0 * row.m * row.n * row.k, nbytes, GemmShape(row.m, row.n, row.k),
                         _LEGACY_DTYPE[row.dtype], hw).seconds
    if isinstance(row, AttentionRow):
        w = attention_work(row.batch, row.heads, row.kv_heads, row.head_dim, row.head_dim, row.query, row.context,
                           row.window or None)
        read, written = attention_bytes(w, 2, 1 if row.kv_dtype == "fp8" else 2)
        return attention_time(attention_flops(w), read + written, w, "bf16", hw).seconds
    if isinstance(row, MoeRow):
        w = ExpertsWork(tokens=row.tokens, num_experts=row.experts, top_k=row.top_k, hidden_size=row.hidden,
                        intermediate_size=row.inter // row.tp, gated=True,
                        active_experts=expected_active_experts(row.tokens, row.experts, row.top_k) / row.ep,
                        imbalance=1.0)
        flops = experts_flops(w) / row.ep
        weights = w.active_experts * 3 * row.hidden * (row.inter // row.tp) * _WEIGHT_BYTES[row.dtype]
        nbytes = weights + row.tokens * row.top_k / row.ep * row.hidden * 4 * 2
        return experts_time(flops, nbytes, w, _LEGACY_DTYPE[row.dtype], hw).seconds
    assert isinstance(row, AllreduceRow)
    return all_reduce_seconds(row.bytes, row.gpus, hw)


def regime(name: str, row) -> str:
    if isinstance(row, GemmRow):
        return "m<=16" if row.m <= 16 else "m<=256" if row.m <= 256 else "m>256"
    if isinstance(row, AttentionRow):
        if row.phase == "prefill":
            tokens = row.batch * row.query
            return "tokens<=128" if tokens <= 128 else "tokens<=4096" if tokens <= 4096 else "tokens>4096"
        kv = row.batch * (row.context + 1)
        return ("batch>=128" if row.batch >= 128 else "kv<=16k" if kv <= 16384 else "kv>16k") + \
            (" window" if row.window else "")
    if isinstance(row, MoeRow):
        return ("tokens<=64" if row.tokens <= 64 else "tokens<=1024" if row.tokens <= 1024 else "tokens>1024") + \
            ("" if row.tp == row.ep == 1 else " tp/ep>1")
    return "<=64KB" if row.bytes <= 65536 else "<=8MB" if row.bytes <= 8 * 2**20 else ">8MB"


def kind(name: str, row) -> str:
    if isinstance(row, GemmRow):
        return f"gemm {row.dtype}"
    if isinstance(row, AttentionRow):
        return f"{row.phase} attention kv {row.kv_dtype}" + (" window" if row.window else "")
    if isinstance(row, MoeRow):     # each runner apart (moe_runners.py): "moe nvfp4_min_latency"
        return f"moe {moe_key(row.dtype, row.runner)}"
    return f"allreduce {row.impl} x{row.gpus}"


def summary(err: np.ndarray) -> dict:
    a = np.abs(err)
    return {"n": int(len(a)), "median": float(np.median(a)), "p90": float(np.percentile(a, 90)),
            "max": float(a.max()), "signed_median": float(np.median(err))}


def evaluate(system: str, engine: str, db: str, refit: bool, seed: int) -> dict:
    hw = load_profile(SYSTEM_PROFILES[system])
    tables, set_aside = without_impossible_rows(load_tables(db, system, engine), hw)
    for note in set_aside:
        print(f"{system} {engine} {note}", file=sys.stderr)
    if refit:
        start = time.time()
        cal = calibrate(tables, hw, engine, "refit by bench/kernel_accuracy.py", seed)
        print(f"{system}: refit in {time.time() - start:.0f} s", file=sys.stderr)
    else:
        cal = hw.engine(engine)
    result = {"system": system, "engine": engine, "origin": cal.origin, "groups": {}, "every_row": {},
              "acceptance": {}, "acceptance_held_out": {}}
    for name, t in tables.items():
        if name == "quant":
            continue
        pred = np.full(len(t.rows), np.nan)
        for key, index in group_rows(t.rows, engine, cal.decode_attention).items():
            try:
                pred[index] = price_group(cal, hw, key, [t.rows[i] for i in index]).seconds
            except ProfileError as e:   # an inherited calibration may lack a format this table has
                print(f"{system}: {len(index)} {'/'.join(map(str, key))} rows not priced: {e}", file=sys.stderr)
        err = pred / t.seconds - 1.0
        held = ~split(len(t.rows), seed)
        # the previous model on a sample of the held-out rows (its scalar formulas are slow on whole tables)
        legacy_sample = np.flatnonzero(held)[:: max(1, held.sum() // 3000)]
        legacy = {i: legacy_seconds(t.rows[i], hw) / t.seconds[i] - 1.0 for i in legacy_sample}
        for i, row in enumerate(t.rows):
            if np.isnan(err[i]):
                continue
            k = kind(name, row)
            result["every_row"].setdefault(k, []).append(err[i])
            if (a := acceptance_kind(row)) is not None:
                result["acceptance"].setdefault(a, []).append(err[i])
                if held[i]:
                    result["acceptance_held_out"].setdefault(a, []).append(err[i])
            if held[i]:
                g = result["groups"].setdefault(k, {"all": [], "regimes": {}, "before": []})
                g["all"].append(err[i])
                g["regimes"].setdefault(regime(name, row), []).append(err[i])
                if i in legacy:
                    g["before"].append(legacy[i])
    return result


def render(results: list[dict]) -> str:
    lines = ["| device | engine | kernel | regime | held-out rows | median | p90 | max | signed median | "
             "before: median | before: p90 |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    pct = lambda v: f"{v * 100:.1f}%"  # noqa: E731
    for r in results:
        for k, g in sorted(r["groups"].items()):
            s, b = summary(np.array(g["all"])), summary(np.array(g["before"])) if g["before"] else None
            lines.append(f"| {r['system']} | {r['engine']} | {k} | all | {s['n']} | {pct(s['median'])} | "
                         f"{pct(s['p90'])} | {pct(s['max'])} | {s['signed_median'] * 100:+.1f}% | "
                         f"{pct(b['median']) if b else '-'} | {pct(b['p90']) if b else '-'} |")
            for name, errs in sorted(g["regimes"].items()):
                s = summary(np.array(errs))
                lines.append(f"| | | | {name} | {s['n']} | {pct(s['median'])} | {pct(s['p90'])} | {pct(s['max'])} | "
                             f"{s['signed_median'] * 100:+.1f}% | | |")
    return "\n".join(lines)


ACCEPTANCE = {  # the targets over every table row: (median, p90 or None)
    "gemm bf16": (0.10, 0.30), "context attention": (0.10, 0.30), "generation attention": (0.10, 0.30),
    "moe bf16 (one GPU)": (0.10, 0.30), "gemm fp8": (0.15, None), "gemm nvfp4": (0.15, None),
    "allreduce nccl": (0.15, None), "allreduce custom": (0.15, None)}


def acceptance_kind(row) -> str | None:
    if isinstance(row, GemmRow):
        return f"gemm {row.dtype}"
    if isinstance(row, AttentionRow):
        return "context attention" if row.phase == "prefill" else "generation attention"
    if isinstance(row, MoeRow):
        return "moe bf16 (one GPU)" if row.dtype == "bf16" and row.tp == row.ep == 1 else None
    return f"allreduce {row.impl}"


def done_check(results: list[dict]) -> str:
    """The issue's acceptance numbers over every table row (fit and held-out halves), and over the held-out half
    alone (rows the fit never saw)."""
    lines = ["| device | kernel | rows | median | p90 | held-out median | held-out p90 | target |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        for k, errs in sorted(r["acceptance"].items()):
            if k not in ACCEPTANCE:
                continue
            med, p90 = ACCEPTANCE[k]
            s, h = summary(np.array(errs)), summary(np.array(r["acceptance_held_out"][k]))
            ok = s["median"] <= med and (p90 is None or s["p90"] <= p90)
            target = f"median <= {med * 100:.0f}%" + ("" if p90 is None else f", p90 <= {p90 * 100:.0f}%")
            lines.append(f"| {r['system']} | {k} | {s['n']} | {s['median'] * 100:.1f}% | {s['p90'] * 100:.1f}% | "
                         f"{h['median'] * 100:.1f}% | {h['p90'] * 100:.1f}% | {target}: {'ok' if ok else 'missed'} |")
    return "\n".join(lines)


MODEL_STEPS = [  # (model, device, tp, weight dtype, request)
    ("llama-3.1-8b", "h100", 1, "bf16", ("prefill", 1, 2048, 0)),
    ("llama-3.1-8b", "h100", 1, "bf16", ("decode", 64, 1, 2048)),
    ("llama-3.1-8b", "l40s", 1, "fp8", ("decode", 64, 1, 2048)),
    ("llama-3.1-70b", "h200", 4, "bf16", ("decode", 64, 1, 4096)),
    ("llama-3.1-70b", "a100", 4, "bf16", ("prefill", 4, 2048, 0)),
    ("qwen3-30b-a3b", "h200", 1, "bf16", ("decode", 32, 1, 2048)),
    ("mixtral-8x7b", "b200", 2, "fp8", ("decode", 128, 1, 1024)),
]


def whole_model() -> str:
    """Step times before (HF-eager efficiencies carried over to the engine's kernels) and after (fitted engine
    kernels), for a few common setups: how far the change moves end-to-end predictions."""
    from cost.estimate import Parallelism, _eager_communication, estimate, price_kernel
    from cost.execution import ENGINE, build_kernels
    from tracer import Request, TraceOptions, trace
    lines = ["| model | device | TP | weights | step | before ms | after ms | after / before |",
             "|---|---|---|---|---|---|---|---|"]
    for model, device, tp, dtype, (phase, b, q, c) in MODEL_STEPS:
        hw = load_profile(device)
        t = trace(model, Request(b, q, c, decode=phase == "decode"), TraceOptions(dtype=dtype))
        par = Parallelism(tp, tp if any(op.experts for op in t.ops) and tp > 1 else 1)
        before = sum(price_kernel(k, hw).seconds * k.count for k in build_kernels(t, ENGINE, par.tp, par.ep))
        before += _eager_communication(t, par, hw)
        after = estimate(t, hw, ENGINE, par).latency_s
        lines.append(f"| {model} | {device} | {tp} | {dtype} | {phase} b={b} q={q} c={c} | {before * 1e3:.2f} | "
                     f"{after * 1e3:.2f} | {after / before:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kernel-db", required=True, help="the aiconfigurator-core wheel or its unzipped folder")
    p.add_argument("--systems", type=system_list, default=None,
                   help="comma-separated table systems (default: every one with a bundled profile that the "
                        "tables hold)")
    p.add_argument("--engine", default=DEFAULT_ENGINE, choices=list(ENGINES))
    p.add_argument("--refit", action="store_true", help="refit on the seeded half instead of using the profiles")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    return run_main(report, p.parse_args(argv))   # tables that cannot be read: one line, exit 2


def report(args) -> int:
    results = []
    systems = args.systems
    if systems is None:
        held = set(table_systems(args.kernel_db))
        systems = [s for s in SYSTEM_PROFILES if s in held]
        if skipped := [s for s in SYSTEM_PROFILES if s not in held]:
            print(f"no tables for {', '.join(skipped)} in {args.kernel_db}: skipped", file=sys.stderr)
    for system in systems:
        start = time.time()
        r = evaluate(system, args.engine, args.kernel_db, args.refit, args.seed)
        results.append(r)
        print(f"{system}: {time.time() - start:.0f} s", file=sys.stderr)
    if args.json:
        out = [{"system": r["system"], "engine": r["engine"], "origin": r["origin"],
                "held_out": {k: {**summary(np.array(g["all"])),
                                 "regimes": {n: summary(np.array(e)) for n, e in g["regimes"].items()},
                                 "before": summary(np.array(g["before"])) if g["before"] else None}
                             for k, g in r["groups"].items()},
                "every_row": {k: summary(np.array(e)) for k, e in r["every_row"].items()},
                "acceptance": {k: summary(np.array(e)) for k, e in r["acceptance"].items()},
                "acceptance_held_out": {k: summary(np.array(e)) for k, e in r["acceptance_held_out"].items()}}
               for r in results]
        print(json.dumps({"systems": out, "whole_model": whole_model()}, indent=1))
    else:
        print("Held-out half (rows the fit never saw):\n")
        print(render(results))
        print("\nAcceptance (every table row, and the held-out half alone):\n")
        print(done_check(results))
        print("\nWhole-model engine step times, before and after:\n")
        print(whole_model())
    return 0


if __name__ == "__main__":
    sys.exit(main())
