"""Fit an engine's overheads beyond its kernels (cost/engines.py ServingOverheads: per-step host time, per
request and step, rank sync, per-request API time, memory reserve) on published end-to-end runs.

    python -m serving.calibrate_overheads --data ../shared/measurements/e2e/published.jsonl --engine trtllm
        [--fit-fraction 0.5] [--seed 0] [--output FILE | --write]

A few parameters per engine, never per row: the fit takes a seeded share of the rows, minimizes the mean
absolute log error of TTFT, TPOT and output tokens/s (each metric weighted alike) by coordinate search on a
log grid within each parameter's bounds, and reports the error on the rows it did not see. `--write` stores
the result in cost/engine_serving.json (the bundled file); without it the result goes to --output.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
from dataclasses import fields, replace
from importlib import resources
from pathlib import Path

from cost.engines import ENGINES, ServingOverheads

from .published import METRICS, Predictor, PublishedRun, load_published


def _loss(runs: list[PublishedRun], predictor: Predictor, params: ServingOverheads) -> float:
    per_metric: dict[str, list[float]] = {m: [] for m in METRICS}
    for run in runs:
        pred, _ = predictor.predict(run, params)
        for m, v in run.measured.items():
            if pred.get(m, 0) > 0 and v > 0:
                per_metric[m].append(abs(math.log(pred[m] / v)))
    parts = [sum(v) / len(v) for v in per_metric.values() if v]
    return sum(parts) / len(parts) if parts else float("inf")


def fit(runs: list[PublishedRun], predictor: Predictor, start: ServingOverheads, rounds: int = 3,
        log=print) -> tuple[ServingOverheads, float]:
    best, best_loss = start, _loss(runs, predictor, start)
    log(f"start: loss {best_loss:.4f}")
    names = [f.name for f in fields(ServingOverheads)]
    bounds = {f.name: f.metadata["bounds"] for f in fields(ServingOverheads)}
    for r in range(rounds):
        factor = (4.0, 2.0, 1.4)[min(r, 2)]
        for name in names:
            lo, hi = bounds[name]
            value = getattr(best, name)
            trials = {min(hi, max(lo, value * f)) for f in (1 / factor, factor)} | ({lo} if value == 0 else set())
            if value == 0:
                trials |= {min(hi, max(lo, x)) for x in (0.1 * hi, 0.01 * hi)}
            for v in sorted(trials):
                if v == value:
                    continue
                cand = replace(best, **{name: v})
                loss = _loss(runs, predictor, cand)
                if loss < best_loss - 1e-5:
                    best, best_loss = cand, loss
                    log(f"round {r + 1}: {name} = {v:.4g}: loss {loss:.4f}")
    return best, best_loss


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m serving.calibrate_overheads", description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="published.jsonl of end-to-end runs")
    p.add_argument("--engine", default="trtllm", choices=list(ENGINES), help="engine whose rows to fit")
    p.add_argument("--fit-fraction", type=float, default=0.5, help="share of rows fitted (default 0.5)")
    p.add_argument("--seed", type=int, default=0, help="seed of the fit/held-out split")
    p.add_argument("--rounds", type=int, default=3, help="coordinate-search rounds (default 3)")
    p.add_argument("--output", default="engine_serving.fitted.json", help="where to write (without --write)")
    p.add_argument("--write", action="store_true", help="store the fit in the bundled cost/engine_serving.json")
    args = p.parse_args(argv)
    if not Path(args.data).is_file():
        print(f"error: {args.data}: no such file", file=sys.stderr)
        return 2
    if not 0 < args.fit_fraction < 1:
        print("error: --fit-fraction must be in (0, 1)", file=sys.stderr)
        return 2
    runs = [r for r in load_published(args.data)[0] if r.engine == args.engine]
    if len(runs) < 4:
        print(f"error: {len(runs)} {args.engine} rows in {args.data}: too few to fit", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    order = list(range(len(runs)))
    rng.shuffle(order)
    cut = int(len(runs) * args.fit_fraction)
    fit_rows = [runs[i] for i in sorted(order[:cut])]
    held = [runs[i] for i in sorted(order[cut:])]
    predictor = Predictor()
    start = ServingOverheads()
    params, loss = fit(fit_rows, predictor, start, args.rounds, log=lambda m: print(m, file=sys.stderr, flush=True))
    before, after = _loss(held, predictor, start), _loss(held, predictor, params)
    print(f"held-out mean |log error| over {len(held)} rows: {before:.4f} (defaults) -> {after:.4f} (fitted)")
    entry = {"origin": f"fitted by python -m serving.calibrate_overheads on {len(fit_rows)} {ENGINES[args.engine].label} "
                       f"rows of {Path(args.data).name} (seed {args.seed}); held-out mean |log error| "
                       f"{before:.3f} -> {after:.3f}",
             "params": {f.name: round(getattr(params, f.name), 4) for f in fields(ServingOverheads)}}
    target = Path(str(resources.files("cost") / "engine_serving.json")) if args.write else Path(args.output)
    data = json.loads(target.read_text()) if target.exists() else {}
    if args.write and after > before:
        print("error: the fit is worse than the defaults on the held-out rows; nothing written", file=sys.stderr)
        return 1
    data[args.engine] = entry
    target.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
