"""Published speculative-decoding runs against tracecost's predictions (issue 22).

    python bench/speculative_accuracy.py [--data FILE...] [--json]

Rows: every development-set row with a draft (chains and SGLang's trees) and the curated published runs in
bench/data/speculative_published.jsonl, each with its source. Each is predicted as
`serving/published.py` predicts any row (its stated model, GPU, layout, formats, lengths and load), with the
acceptance the run states, else the one a closed loop's stream shows (its mean ITL over its mean TPOT: one streamed
chunk a step, serving/published_rows.py stream_acceptance), else the method's published default
(serving/data/speculative.json). The same run without speculation is shown beside it, and the rows whose acceptance
came from their stream are also scored at the method's default, what a user without it would be told. vLLM PR
#24322's sweep also ran without speculation at each concurrency: those runs are predicted too, and the sweep's
speedups over them are shown measured against predicted.

Then the crossover SpecDecode-Bench states (arXiv 2601.11580, Tree vs. Chain Verification; SGLang 0.5.9, EAGLE on
Qwen3-8B, GSM8K, one H100): with the acceptance lengths it reports, the speedup of output tokens/s at a fixed decode
batch (serving/speculative.py speedup_at_batch), next to the speedups it reports.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cost.profile import load_profile                                          # noqa: E402
from serving.published import Predictor, load_published                        # noqa: E402
from serving.published_rows import STREAMED_ACCEPTANCE                           # noqa: E402
from serving.speculative import parse_speculation, speculative_step, speedup_at_batch   # noqa: E402
from serving.step_cost import StepCost                                         # noqa: E402
from tracer import TraceOptions, resolve_model                                 # noqa: E402
from tracer.table import format_table                                          # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEV = sorted(str(p) for p in (ROOT.parent / "shared" / "measurements" / "e2e").glob("*.jsonl"))
CURATED = str(ROOT / "bench" / "data" / "speculative_published.jsonl")


# SpecDecode-Bench's SGLang comparison: (label, (k, topk, N), acceptance length, {batch: stated speedup})
CROSSOVER = [("chain k=3", (3, 1, None), 2.25, {1: "1.65x"}),
             ("tree depth 3, branching 4, 21 drafted", (3, 4, 22), 2.92, {1: "1.85x", 64: "< 1x"})]
CROSSOVER_BATCHES = (1, 8, 32, 64, 128)
CROSSOVER_CONTEXT = 512     # a GSM8K request's mean context: a ~100-token question and its worked answer


def crossover() -> list[dict]:
    """Predicted speedups at fixed decode batches for SpecDecode-Bench's chain and tree (the stated acceptance)."""
    cost = StepCost(resolve_model("qwen3-8b"), load_profile("h100"), TraceOptions(), "engine", 1, "sglang")
    rows = []
    for label, (k, topk, n), length, stated in CROSSOVER:
        step = speculative_step(cost, parse_speculation("eagle3", k, acceptance_length=length, topk=topk,
                                                        draft_tokens=n))
        rows.append({"setup": label, "acceptance_length": length, "stated": stated,
                     "predicted": {b: speedup_at_batch(step, b, CROSSOVER_CONTEXT) for b in CROSSOVER_BATCHES}})
    return rows


PR24322_K = (3, 4, 5, 6, 7, 8)


SCORED = ("tpot_ms", "output_tok_s")   # issue 22's criterion: TPOT and output tokens/s within 20%
SHOWN = SCORED + ("ttft_ms",)
SUMMARY_COLUMNS = ["runs", "rows", "TPOT median |error|", "tok/s median |error|", "TTFT median |error|",
                   "TPOT and tok/s within 20%"]


def _errors(run, pred: dict) -> dict:
    return {m: pred[m] / v - 1 for m, v in run.measured.items() if m in pred and v}


def at_default(spec):
    """The same draft with the method's published default acceptance (a tree's widened)."""
    return parse_speculation(spec.method_name, spec.k, topk=spec.topk, draft_tokens=spec.draft_tokens or None)


def summary(rows: list[dict]) -> list[list[str]]:
    """Median |error| of TPOT, output tokens/s and TTFT per method and source, and the rows within 20% on both
    TPOT and output tokens/s (TTFT is shown, not scored)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["setup"].split(" ")[0], r["id"].split("-")[0]), []).append(r)
    out = []
    for (method, source), rs in sorted(groups.items()):
        med = {m: [abs(r["error"][m]) for r in rs if m in r["error"]] for m in SHOWN}
        within = sum(all(abs(r["error"][m]) <= 0.2 for m in SCORED if m in r["error"]) for r in rs)
        out.append([f"{method} ({source})", str(len(rs))]
                   + [f"{statistics.median(med[m]):.1%}" if med[m] else "-" for m in SHOWN]
                   + [f"{within} of {len(rs)}"])
    return out


PR24322_CELL = re.compile(r"vllm_pr24322-.*-(draft-1b|eagle3)-k(\d+)-c(\d+)$")
PR24322_BASELINE = re.compile(r"vllm_pr24322-.*-nospec-c(\d+)$")


def _sweep_cells(rows: list[dict]) -> dict[tuple, dict]:
    """vLLM PR #24322's speculative rows by (method, users, k)."""
    cells = {}
    for r in rows:
        m = PR24322_CELL.search(r["id"])
        if m:
            cells[(m.group(1), int(m.group(3)), int(m.group(2)))] = r
    return cells


def _sweep_grid(cells: dict[tuple, dict], cell) -> list[list[str]]:
    out = []
    for method, users in sorted({(m, u) for m, u, _ in cells}):
        line = ["draft: Llama-3.2-1B" if method == "draft-1b" else "EAGLE-3", str(users)]
        line += [cell(cells[(method, users, k)], users) if (method, users, k) in cells else "-" for k in PR24322_K]
        out.append(line)
    return out


def pr24322_sweep(rows: list[dict]) -> list[list[str]]:
    """The k x users grid of vLLM PR #24322's runs: output tok/s error (TPOT error) per cell."""
    return _sweep_grid(_sweep_cells(rows), lambda r, _: f"{r['error']['output_tok_s']:+.0%} "
                                                        f"({r['error']['tpot_ms']:+.0%})")


def _speedup(r: dict, baseline: dict, side: str) -> float:
    """Output tok/s speculating over the plain run's at the same users, both `measured` or both `predicted`."""
    return r[side]["output_tok_s"] / baseline[side]["output_tok_s"]


def pr24322_speedups(rows: list[dict], baselines: dict[int, dict]) -> list[list[str]]:
    """The same grid as speedups of output tok/s over the sweep's own runs without speculation at the same users:
    measured / predicted (the prediction divides by the prediction of that plain run)."""
    def cell(r: dict, users: int) -> str:
        b = baselines.get(users)
        return "-" if b is None else f"{_speedup(r, b, 'measured'):.2f} / {_speedup(r, b, 'predicted'):.2f}"
    return _sweep_grid(_sweep_cells(rows), cell)


def speedup_errors(rows: list[dict], baselines: dict[int, dict]) -> list[float]:
    """Predicted over measured speedup, less one, for every cell of the sweep with a baseline."""
    return [_speedup(r, baselines[users], "predicted") / _speedup(r, baselines[users], "measured") - 1
            for (_, users, _), r in sorted(_sweep_cells(rows).items()) if users in baselines]


def pr24322_best(rows: list[dict], baselines: dict[int, dict]) -> list[list[str]]:
    """Per method and users, the k with the most output tok/s, measured against predicted, each with its speedup over
    the plain run at those users (where the sweep ran one): what the optimizer's search over k would pick."""
    cells, out = _sweep_cells(rows), []
    for method, users in sorted({(m, u) for m, u, _ in cells}):
        ks = {k: r for (m, u, k), r in cells.items() if (m, u) == (method, users)}
        line = ["draft: Llama-3.2-1B" if method == "draft-1b" else "EAGLE-3", str(users)]
        for side in ("measured", "predicted"):
            k = max(ks, key=lambda k: ks[k][side]["output_tok_s"])
            b = baselines.get(users)
            x = f", {_speedup(ks[k], b, side):.2f}x" if b else ""
            line.append(f"k={k}{x}")
        out.append(line)
    return out


def logged_kv_rows(runs, predictor: Predictor, estimating: Predictor) -> list[dict]:
    """Each setup whose runs state the KV capacity their engine logged: that capacity against tracecost's own
    estimate from memory (the engine's budget less weights, activations and the draft)."""
    setups = {}
    for run in runs:
        if run.kv_cache_tokens:
            label = re.sub(r" k=\d+$", "", run.speculation.label) if run.speculation else "none"
            setups.setdefault((run.model, run.device, run.tp, label), {
                "model": run.model, "device": run.device, "tp": run.tp, "speculation": label,
                "logged": run.kv_cache_tokens, "estimated": estimating.limits(run, predictor.cost(run)).kv_tokens})
    return list(setups.values())


def baseline_rows(runs, predictor) -> dict[int, dict]:
    """vLLM PR #24322's runs without speculation (its sweep's baseline), by users, each predicted."""
    out = {}
    for run in runs:
        m = PR24322_BASELINE.search(run.id)
        if m and run.speculation is None:
            pred, _ = predictor.predict(run)
            out[int(m.group(1))] = {"id": run.id, "measured": run.measured, "predicted": pred,
                                    "error": _errors(run, pred)}
    return dict(sorted(out.items()))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", nargs="+", default=DEV + [CURATED], help="JSONL files of runs")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    runs, skipped = load_published(*args.data)
    predictor, out = Predictor(), []
    estimating = predictor.estimating_kv()
    baselines = baseline_rows(runs, predictor)
    kv = logged_kv_rows(runs, predictor, estimating)
    runs = [r for r in runs if r.speculation is not None]
    refused = [(i, why) for i, why in skipped if any(w in why for w in ("tree drafts", "speculative"))]
    for run in runs:
        pred, _ = predictor.predict(run)
        plain, _ = predictor.predict(replace(run, speculation=None))
        row = {"id": run.id, "setup": run.speculation.label, "tokens_per_step": run.speculation.tokens_per_step,
               "acceptance_from": run.speculation.source.split(":")[0], "device": run.device, "engine": run.engine,
               "measured": run.measured, "predicted": pred, "without_speculation": plain,
               "error": _errors(run, pred)}
        if STREAMED_ACCEPTANCE in run.speculation.source:    # what a user without that acceptance is told
            default = replace(run, speculation=at_default(run.speculation))
            row["at_default"] = {"tokens_per_step": default.speculation.tokens_per_step,
                                 "error": _errors(run, predictor.predict(default)[0])}
        if run.kv_cache_tokens:     # what tracecost says without the engine's logged capacity
            row["kv_cache_tokens"] = run.kv_cache_tokens
            row["at_estimated_kv"] = {"error": _errors(run, estimating.predict(run)[0])}
        out.append(row)
    cross = crossover()
    if args.json:
        print(json.dumps({"rows": out, "refused": refused, "baselines": baselines, "logged_kv": kv,
                          "crossover": cross}, indent=1))
        return 0
    table = []
    for r in out:
        m, q, e = r["measured"], r["predicted"], r["error"]
        table.append([r["id"][:44], r["setup"], f"{r['tokens_per_step']:.2f}", r["acceptance_from"],
                      f"{m.get('tpot_ms', 0):.2f}", f"{q['tpot_ms']:.2f}", f"{e.get('tpot_ms', 0):+.1%}",
                      f"{m.get('output_tok_s', 0):,.0f}", f"{q['output_tok_s']:,.0f}", f"{e.get('output_tok_s', 0):+.1%}",
                      f"{r['without_speculation']['output_tok_s']:,.0f}"])
    print(format_table(["run", "setup", "tok/step", "acceptance", "TPOT ms", "pred", "error", "tok/s", "pred",
                        "error", "pred w/o spec"], table))
    for i, why in refused:
        print(f"refused {i}: {why}")
    print()
    print(format_table(SUMMARY_COLUMNS, summary(out), title="Per method and source"))
    print()
    streamed = [{**r, "tokens_per_step": r["at_default"]["tokens_per_step"], "error": r["at_default"]["error"]}
                for r in out if "at_default" in r]
    if streamed:
        print(format_table(SUMMARY_COLUMNS, summary(streamed),
                           title="The rows whose acceptance their stream shows, at the method's default acceptance "
                                 "instead"))
        print()
    estimated = [{**r, "error": r["at_estimated_kv"]["error"]} for r in out if "at_estimated_kv" in r]
    if kv:
        print(format_table(["model", "device", "TP", "speculation", "logged", "tracecost", "error"],
                           [[k["model"], k["device"], str(k["tp"]), k["speculation"], f"{k['logged']:,}",
                             f"{k['estimated']:,}", f"{k['estimated'] / k['logged'] - 1:+.1%}"] for k in kv],
                           title="KV capacity per replica in tokens: what the engine logged, which the rows above are "
                                 "priced at, and tracecost's own estimate from memory"))
        print()
        print(format_table(SUMMARY_COLUMNS, summary(estimated),
                           title="The same rows at tracecost's own KV estimate instead of the logged capacity"))
        print()
    sweep = pr24322_sweep(out)
    if sweep:
        print(format_table(["setup", "users"] + [f"k={k}" for k in PR24322_K], sweep,
                           title="vLLM PR #24322's sweep (Llama-3.3-70B on 2 x H100 PCIe): output tok/s error "
                                 "(TPOT error)"))
        print()
    if baselines:
        print(format_table(["users", "TPOT ms", "pred", "error", "tok/s", "pred", "error", "TTFT error"],
                           [[str(u), f"{b['measured']['tpot_ms']:.2f}", f"{b['predicted']['tpot_ms']:.2f}",
                             f"{b['error']['tpot_ms']:+.1%}", f"{b['measured']['output_tok_s']:,.0f}",
                             f"{b['predicted']['output_tok_s']:,.0f}", f"{b['error']['output_tok_s']:+.1%}",
                             f"{b['error']['ttft_ms']:+.1%}"] for u, b in baselines.items()],
                           title="The same sweep without speculation (its baseline runs)"))
        print()
        print(format_table(["setup", "users"] + [f"k={k}" for k in PR24322_K], pr24322_speedups(out, baselines),
                           title="The sweep's speedup of output tok/s over its runs without speculation: measured / "
                                 "predicted"))
        errors = speedup_errors(out, baselines)
        if errors:
            print(f"speedup, predicted against measured: median abs error {statistics.median(map(abs, errors)):.1%} "
                  f"over {len(errors)} cells ({min(errors):+.0%} to {max(errors):+.0%})")
        print()
        print(format_table(["setup", "users", "best k measured", "best k predicted"], pr24322_best(out, baselines),
                           title="The sweep's best k by output tok/s (speedup over the plain run)"))
        print()
    print(format_table(["SpecDecode-Bench setup", "accept len"] + [f"batch {b}" for b in CROSSOVER_BATCHES],
                       [[r["setup"], f"{r['acceptance_length']:g}"]
                        + [f"{r['predicted'][b]:.2f}x" + (f" (stated {r['stated'][b]})" if b in r["stated"] else "")
                           for b in CROSSOVER_BATCHES] for r in cross],
                       title=f"Qwen3-8B on one H100, SGLang: output tokens/s speculating over not, at a fixed decode "
                             f"batch (context {CROSSOVER_CONTEXT})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
