"""Fit an engine's streaming cost (cost/engines.py ServingOverheads.stream_us: a response per running request per
step when the client takes every token as it comes) on the MLPerf Server and Interactive runs.

    python -m serving.calibrate_stream --engine trtllm [--data FILE ...] [--grid 0,10,20,30,40,50] [--seed 0]
        [--objective both] [--fit-fraction 0.5] [--jobs 2] [--output FILE | --write]

The same systems ran Offline, which does not stream and whose batches cost less per step; that difference is
what stream_us stands for. The objective (`--objective`) is each run's operating point, as bench/e2e_accuracy.py
checks it:
- `rate`: the highest request rate whose predicted p99 TTFT and TPOT stay within the scenario's limits, against
  the rate the submitter ran. The submitter's rate is a run that passed, not the highest that would have: a fit
  to it alone places the capacity at the submitted rate, where the queue for a slot has already begun;
- `operating-point`: the mean TTFT and TPOT at the submitter's rate. So near capacity they move by tens of
  percent with a rate a few percent off, and a fit to them alone would chase the edge of stability;
- `both` (default): the three errors, each metric weighted alike.

Runs are split (seeded) into a fitted and a held-out share, as serving/calibrate_overheads.py splits them. Each
run's rate is priced at every grid value and interpolated linearly between them; the fit takes the value of least
mean |log error| (capped at 2x per run) on the fitted share and reports both shares. Rows on a device without the
engine's own kernel fit are left out (their error is the kernels'). `--write` stores the value in the engine's
shared parameters in cost/engine_serving.json, with where it comes from (`stream_origin`).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import replace
from importlib import resources
from pathlib import Path

import numpy as np

from cost.engines import ENGINES

from .calibrate_overheads import DEV_SET, LOSS_CAP, fitted_kernels, split
from .published import Predictor, PredictorPool, PublishedRun, load_published, rate_within_limits
from .steady_state import RATE


def streamed_limit_runs(runs: list[PublishedRun], engine: str) -> list[PublishedRun]:
    """The engine's streamed runs with latency limits at a stated rate, on devices with its own kernel fit."""
    return [r for r in runs if r.engine == engine and r.streams and r.latency_limits and r.load.kind == RATE
            and fitted_kernels(r)]


def rate_error(predictor: Predictor, run: PublishedRun, stream_us: float) -> float | None:
    """The predicted highest rate within the limits over the submitter's, less 1, with this streaming cost
    (None: the setup is refused)."""
    cost = predictor.cost(run)
    base = cost.overheads
    cost.overheads = replace(base, stream_us=stream_us)
    try:
        return rate_within_limits(predictor, run) / (run.load.value * run.replicas) - 1.0
    except ValueError:
        return None
    finally:
        cost.overheads = base


def operating_point_errors(predictor: Predictor, run: PublishedRun, stream_us: float) -> dict[str, float]:
    """Predicted over measured mean TTFT and TPOT at the submitter's rate, less 1, with this streaming cost ({}:
    the setup is refused)."""
    try:
        pred = predictor.predict(run, replace(predictor.cost(run).overheads, stream_us=stream_us))[0]
    except (ValueError, RuntimeError):
        return {}
    return {m: pred[m] / run.measured[m] - 1.0 for m in ("ttft_ms", "tpot_ms")
            if run.measured.get(m, 0) > 0 and pred.get(m, 0) > 0}


OBJECTIVES = {"rate": ("rate",), "operating-point": ("ttft_ms", "tpot_ms"), "both": ("rate", "ttft_ms", "tpot_ms")}


def _priced(predictor: Predictor, job):
    run, value, metrics = job
    errors = operating_point_errors(predictor, run, value) if set(metrics) - {"rate"} else {}
    if "rate" in metrics and (err := rate_error(predictor, run, value)) is not None:
        errors["rate"] = err
    return run.id, value, errors


def price_grid(runs: list[PublishedRun], grid: list[float], jobs: int, log,
               metrics: tuple[str, ...] = ("rate",)) -> dict[str, dict[str, dict[float, float]]]:
    """Every run's errors at every grid value: {metric: {run id: {value: error}}} (a run refused at any value
    left out of that metric)."""
    with PredictorPool(Predictor(), jobs) as pool:
        results = list(pool.apply(_priced, [(r, v, metrics) for r in runs for v in grid], chunksize=2))
    out: dict[str, dict[str, dict[float, float]]] = {m: {} for m in metrics}
    for run_id, value, errors in results:
        for m, err in errors.items():
            out[m].setdefault(run_id, {})[value] = err
    log(f"priced {len(runs)} runs at {len(grid)} values")
    return {m: {k: v for k, v in rows.items() if len(v) == len(grid)} for m, rows in out.items()}


def interpolated(errors: dict[float, float], value: float) -> float:
    """A run's rate error at `value`, linear between the priced grid values (held at the ends)."""
    grid = sorted(errors)
    return float(np.interp(value, grid, [errors[g] for g in grid]))


def mean_loss(rows: list[dict[float, float]], value: float) -> float:
    return sum(min(abs(math.log1p(interpolated(e, value))), LOSS_CAP) for e in rows) / max(1, len(rows))


def objective_loss(by_metric: dict[str, list[dict[float, float]]], value: float) -> float:
    """The mean over metrics of each metric's mean capped |log error|."""
    parts = [mean_loss(rows, value) for rows in by_metric.values() if rows]
    return sum(parts) / len(parts) if parts else math.inf


def summary(rows: list[dict[float, float]], value: float) -> dict:
    errs = [interpolated(e, value) for e in rows]
    return {"rows": len(errs), "median_abs": round(statistics.median(abs(x) for x in errs), 4),
            "signed_median": round(statistics.median(errs), 4)} if errs else {"rows": 0}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m serving.calibrate_stream", description=__doc__.split("\n")[0])
    p.add_argument("--data", nargs="+", default=sorted(str(f) for f in DEV_SET.glob("*.jsonl")),
                   help="JSONL files of end-to-end runs (default: every file of ../shared/measurements/e2e)")
    p.add_argument("--engine", default="trtllm", choices=list(ENGINES), help="engine whose runs to fit")
    p.add_argument("--grid", default="0,10,20,30,40,50", help="stream_us values priced, us (default 0,10,20,30,40,50)")
    p.add_argument("--objective", default="both", choices=list(OBJECTIVES),
                   help="what the fit matches: the highest rate within the limits (rate), the mean TTFT and TPOT at "
                        "the submitter's rate (operating-point), or all three (both, default)")
    p.add_argument("--fit-fraction", type=float, default=0.5, help="share of the runs fitted (default 0.5)")
    p.add_argument("--seed", type=int, default=0, help="seed of the fit/held-out split")
    p.add_argument("--jobs", type=int, default=1, help="processes pricing runs in parallel (default 1)")
    p.add_argument("--output", default="engine_serving.stream.json", help="where to write (without --write)")
    p.add_argument("--write", action="store_true", help="store the fit in the bundled cost/engine_serving.json")
    args = p.parse_args(argv)
    try:
        grid = sorted({float(x) for x in args.grid.split(",")})
    except ValueError:
        print(f"error: --grid: '{args.grid}' is not a list of numbers", file=sys.stderr)
        return 2
    if len(grid) < 2 or grid[0] < 0 or grid[-1] > 200 or not 0 < args.fit_fraction < 1 or args.jobs < 1:
        print("error: --grid needs two or more values in [0, 200], --fit-fraction in (0, 1), --jobs >= 1",
              file=sys.stderr)
        return 2
    missing = [d for d in args.data if not Path(d).is_file()]
    if missing or not args.data:
        print(f"error: {(missing or ['--data'])[0]}: no such file", file=sys.stderr)
        return 2
    grid = sorted(set(grid) | {0.0})     # the "without" the report states is priced, never extrapolated
    t0, log = time.time(), (lambda m: print(m, file=sys.stderr, flush=True))
    runs = streamed_limit_runs(load_published(*args.data)[0], args.engine)
    if len(runs) < 4:
        print(f"error: {len(runs)} streamed {args.engine} runs with latency limits: too few to fit", file=sys.stderr)
        return 2
    fit_runs, held_runs = split(runs, args.fit_fraction, args.seed)
    metrics = OBJECTIVES[args.objective]
    errors = price_grid(runs, grid, args.jobs, log, metrics)
    fit = {m: [errors[m][r.id] for r in fit_runs if r.id in errors[m]] for m in metrics}
    held = {m: [errors[m][r.id] for r in held_runs if r.id in errors[m]] for m in metrics}
    steps = [grid[0] + (grid[-1] - grid[0]) * i / 200 for i in range(201)]
    value = round(min(steps, key=lambda v: (objective_loss(fit, v), v)), 1)
    result = {"stream_us": value, "objective": args.objective,
              "fitted": {m: summary(fit[m], value) for m in metrics},
              "held_out": {m: summary(held[m], value) for m in metrics},
              "held_out_without": {m: summary(held[m], 0.0) for m in metrics}, "grid": grid, "seed": args.seed}
    print(json.dumps(result, indent=1))
    names = ", ".join(Path(d).name for d in args.data)
    said = {"rate": "highest rate within the limits", "ttft_ms": "mean TTFT at the submitter's rate",
            "tpot_ms": "mean TPOT at the submitter's rate"}
    origin = (f"fitted by python -m serving.calibrate_stream --objective {args.objective} on "
              f"{len(next(iter(fit.values())))} streamed {ENGINES[args.engine].label} runs with latency limits of "
              f"{names} (seed {args.seed}, fit fraction {args.fit_fraction:g}); "
              f"{len(next(iter(held.values())))} held out, median |error| without -> with: " +
              "; ".join(f"{said[m]} {result['held_out_without'][m].get('median_abs', float('nan')):.1%} -> "
                        f"{result['held_out'][m].get('median_abs', float('nan')):.1%}" for m in metrics))
    target = Path(str(resources.files("cost") / "engine_serving.json")) if args.write else Path(args.output)
    data = json.loads((resources.files("cost") / "engine_serving.json").read_text()) if args.write or not target.exists() \
        else json.loads(target.read_text())
    entry = data.setdefault(args.engine, {})
    entry.setdefault("shared", {}).setdefault("params", {})["stream_us"] = value
    entry["stream_origin"] = origin
    target.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {target} ({time.time() - t0:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
