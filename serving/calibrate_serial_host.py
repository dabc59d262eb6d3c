"""Fit the host work an engine runs in series with the GPU when it speculates without its overlap scheduler.

    python -m serving.calibrate_serial_host [--engine sglang] [--data FILE...] [--seed 0] [--fit-fraction 0.5]
                                            [--write]

SGLang turns its overlap scheduler off for EAGLE, EAGLE-3, NEXTN (its MTP) and STANDALONE drafts unless
SGLANG_ENABLE_SPEC_V2 is set (python/sglang/srt/server_args.py: "Overlap scheduler is disabled because of using
eagle3 or standalone speculative decoding"), and for n-gram drafts as well. The scheduler's work per step then runs
between the GPU's steps instead of beside them. Its size is two numbers (serving/speculative.py SerialHost: per
step, per running request), fitted here on the development set's speculative runs of the engine: a seeded share of
them is fitted, the rest is held out and reported, and SpecDecode-Bench's batch-1 speedups (bench/
speculative_accuracy.py) are never seen. The loss is the mean squared log error of TPOT and output tokens/s.
--write stores the fit in serving/data/speculative.json ("serial_host").
"""
from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
from importlib import resources
from pathlib import Path

import numpy as np
from scipy.optimize import minimize

from .published import Predictor, PublishedRun, load_published
from .speculative import SerialHost

ROOT = Path(__file__).resolve().parents[1]
DEV = sorted(str(p) for p in (ROOT.parent / "shared" / "measurements" / "e2e").glob("*.jsonl"))
METRICS = ("tpot_ms", "output_tok_s")
SOURCE = {"sglang": "SGLang runs EAGLE, EAGLE-3, NEXTN (MTP) and STANDALONE drafts without its overlap scheduler "
                    "unless SGLANG_ENABLE_SPEC_V2 is set (python/sglang/srt/server_args.py, 0.5.x: \"Overlap "
                    "scheduler is disabled because of using eagle3 or standalone speculative decoding\"), n-gram "
                    "drafts likewise (\"The overlap scheduler and mixed chunked prefill are disabled because of "
                    "using ngram speculative decoding\")"}


def split(runs: list[PublishedRun], seed: int, fraction: float) -> tuple[list, list]:
    """A seeded share of the runs to fit and the rest to hold out (at least one of each when there are two)."""
    order = sorted(runs, key=lambda r: r.id)
    random.Random(seed).shuffle(order)
    n = min(len(order) - 1, max(1, round(len(order) * fraction))) if len(order) > 1 else len(order)
    return order[:n], order[n:]


def errors(predictor: Predictor, runs: list[PublishedRun], host: SerialHost) -> list[float]:
    """log(predicted / measured) of every stated metric of every run, priced with `host`."""
    out = []
    for run in runs:
        predictor.cost(run).serial_host = host
        pred, _ = predictor.predict(run)
        out += [math.log(pred[m] / v) for m, v in run.measured.items() if m in METRICS and v and pred.get(m)]
    return out


def fit(predictor: Predictor, runs: list[PublishedRun]) -> SerialHost:
    """The SerialHost that minimises the mean squared log error over `runs`: a coarse grid, then Powell within the
    parameters' bounds."""
    low, high = SerialHost.bounds()

    def loss(x) -> float:
        e = errors(predictor, runs, SerialHost().with_vector(np.clip(x, low, high)))
        return float(np.mean(np.square(e)))

    grid = [(s, q) for s in (0, 250, 500, 1000, 2000, 3500) for q in (0, 10, 25, 50)]
    start = min(grid, key=loss)
    best = minimize(loss, np.array(start, float), method="Powell", bounds=list(zip(low, high)),
                    options={"xtol": 5.0, "ftol": 1e-5, "maxfev": 200})
    return SerialHost().with_vector(np.clip(best.x, low, high))


def _one_line(m: re.Match) -> str:
    """A short innermost JSON list or object on one line, as the data file writes them."""
    flat = json.dumps(json.loads(m.group(0)))
    return flat if len(flat) <= 80 else m.group(0)


def median_abs(e: list[float]) -> float:
    return float(np.median(np.abs(np.expm1(e)))) if e else float("nan")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--engine", default="sglang", choices=sorted(SOURCE))
    p.add_argument("--data", nargs="+", default=DEV, help="JSONL files of runs (default: the development set)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fit-fraction", type=float, default=0.5)
    p.add_argument("--write", action="store_true", help="store the fit in serving/data/speculative.json")
    args = p.parse_args(argv)
    if not 0 < args.fit_fraction < 1:
        print("error: --fit-fraction must be in (0, 1)", file=sys.stderr)
        return 2
    runs = [r for r in load_published(*args.data)[0] if r.engine == args.engine and r.speculation is not None]
    if len(runs) < 2:
        print(f"error: {len(runs)} speculative {args.engine} runs in the data: nothing to fit and hold out",
              file=sys.stderr)
        return 2
    fitted, held = split(runs, args.seed, args.fit_fraction)
    predictor = Predictor()
    host = fit(predictor, fitted)
    before, after = errors(predictor, held, SerialHost()), errors(predictor, held, host)
    print(f"{args.engine}: step_us {host.step_us:.1f}, seq_us {host.seq_us:.1f} (fitted on {len(fitted)} runs)")
    print(f"held out ({len(held)} runs: {', '.join(r.id for r in held)}): median |error| of TPOT and output "
          f"tok/s {median_abs(before):.1%} without -> {median_abs(after):.1%}")
    if args.write:
        path = resources.files("serving") / "data" / "speculative.json"
        data = json.loads(path.read_text())
        names = sorted({Path(f).name for f in args.data})
        data.setdefault("serial_host", {})[args.engine] = {
            "params": {k: round(v, 1) for k, v in host.to_json().items()},
            "source": SOURCE[args.engine],
            "fit": f"fitted by python -m serving.calibrate_serial_host on {len(fitted)} speculative {args.engine} "
                   f"runs of {', '.join(names)} (seed {args.seed}, fit fraction {args.fit_fraction:g}); "
                   f"{len(held)} held out: median |error| {median_abs(before):.1%} without -> {median_abs(after):.1%}"}
        text = re.sub(r"[\[{][^\[\]{}]*[\]}]", _one_line, json.dumps(data, indent=2))
        Path(str(path)).write_text(text + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
