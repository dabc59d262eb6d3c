"""Fit an engine's streaming cost (cost/engines.py ServingOverheads.stream_us: a response per running request per
step when the client takes every token as it comes) on the MLPerf Server and Interactive runs.

    python -m serving.calibrate_stream --engine trtllm [--data FILE ...] [--grid 0,10,20,30,40,50] [--seed 0]
        [--fit-fraction 0.5] [--jobs 2] [--output FILE | --write]

The same systems ran Offline, which does not stream and whose batches cost less per step; that difference is
what stream_us stands for. The objective is each run's operating point, the check bench/e2e_accuracy.py reports:
the highest request rate whose predicted p99 TTFT and TPOT stay within the scenario's limits, against the rate
the submitter ran. Mean TTFT and TPOT at the submitter's rate are not the objective: so near capacity they move
by tens of percent with a rate a few percent off, and a fit to them would chase the edge of stability.

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


def _priced(predictor: Predictor, job):
    run, value = job
    return run.id, value, rate_error(predictor, run, value)


def price_grid(runs: list[PublishedRun], grid: list[float], jobs: int, log) -> dict[str, dict[float, float]]:
    """Every run's rate error at every grid value: {run id: {value: error}} (refused runs left out)."""
    with PredictorPool(Predictor(), jobs) as pool:
        results = list(pool.apply(_priced, [(r, v) for r in runs for v in grid], chunksize=2))
    out: dict[str, dict[float, float]] = {}
    for run_id, value, err in results:
        if err is not None:
            out.setdefault(run_id, {})[value] = err
    log(f"priced {len(runs)} runs at {len(grid)} values")
    return {k: v for k, v in out.items() if len(v) == len(grid)}


def interpolated(errors: dict[float, float], value: float) -> float:
    """A run's rate error at `value`, linear between the priced grid values (held at the ends)."""
    grid = sorted(errors)
    return float(np.interp(value, grid, [errors[g] for g in grid]))


def mean_loss(rows: list[dict[float, float]], value: float) -> float:
    return sum(min(abs(math.log1p(interpolated(e, value))), LOSS_CAP) for e in rows) / max(1, len(rows))


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
    t0, log = time.time(), (lambda m: print(m, file=sys.stderr, flush=True))
    runs = streamed_limit_runs(load_published(*args.data)[0], args.engine)
    if len(runs) < 4:
        print(f"error: {len(runs)} streamed {args.engine} runs with latency limits: too few to fit", file=sys.stderr)
        return 2
    fit_runs, held_runs = split(runs, args.fit_fraction, args.seed)
    errors = price_grid(runs, grid, args.jobs, log)
    fit = [errors[r.id] for r in fit_runs if r.id in errors]
    held = [errors[r.id] for r in held_runs if r.id in errors]
    steps = [grid[0] + (grid[-1] - grid[0]) * i / 200 for i in range(201)]
    value = round(min(steps, key=lambda v: (mean_loss(fit, v), v)), 1)
    result = {"stream_us": value, "fitted": summary(fit, value), "held_out": summary(held, value),
              "held_out_without": summary(held, 0.0), "grid": grid, "seed": args.seed}
    print(json.dumps(result, indent=1))
    names = ", ".join(Path(d).name for d in args.data)
    origin = (f"fitted by python -m serving.calibrate_stream on {len(fit)} streamed {ENGINES[args.engine].label} runs "
              f"with latency limits of {names} (seed {args.seed}, fit fraction {args.fit_fraction:g}); "
              f"{len(held)} held out: highest rate within the limits median |error| "
              f"{result['held_out_without']['median_abs']:.1%} without -> {result['held_out']['median_abs']:.1%}")
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
