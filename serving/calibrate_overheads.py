"""Fit an engine's overheads beyond its kernels (cost/engines.py ServingOverheads: per-step host time, per
request and step, rank sync, per-request API time; the memory reserve is the engine's accounting and the
streaming cost has its own fit, serving/calibrate_stream.py: both kept as set)
on published end-to-end runs, release by release.

    python -m serving.calibrate_overheads --engine trtllm [--data FILE ...] [--fit-fraction 0.5] [--seed 0]
        [--release R ...] [--output FILE | --write]

A few parameters per engine, never per row. Each release's rows are split (seeded) into a fitted and a
held-out share. The physics is shared: one set of overheads is fitted on the fitted rows of every release.
Then each release may take its own value of a parameter, only where its rows demand one: a term is kept when
it lowers that release's loss on its fitted rows by more than `--demand` (default 0.02, i.e. 2% mean
|log error|); `--release` refits only the named releases' terms, over the bundled shared overheads. The loss is the mean absolute log error, capped at 2x per row, of TTFT, TPOT, output tokens/s and batch latency (each
metric weighted alike; a run the candidate overheads refuse counts at the cap), minimized by coordinate search on a log grid within each parameter's bounds. The
report gives every release's error on the rows the fit did not see. Rows on a device whose kernels are not
fitted for the engine (carried over from another device, or another engine's) are left out: their error is
the kernels', not the engine's overheads. `--write` stores the result in cost/engine_serving.json.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections import defaultdict
from dataclasses import fields, replace
from importlib import resources
from pathlib import Path

from cost.engines import ENGINES, ServingOverheads, release_key
from cost.profile import load_profile, profiles_dir

from .published import Predictor, PredictorPool, PublishedRun, load_published

DEV_SET = Path(__file__).resolve().parents[2] / "shared" / "measurements" / "e2e"
# what a release may change without changing the physics: the speed of the kernels it was built with (tried
# first: the largest change between releases, and the one runs without host overheads show directly), its
# scheduler's host time, its per-sequence bookkeeping, its rank sync and its API path (memory reserve stays
# shared; the shared kernel time is 1, the kernel fits' own release)
RELEASE_TERMS = ("kernel_time", "step_us", "seq_us", "gpu_sync_us", "request_ms", "frontend_ms")
# what the fit searches: every overhead but the memory reserve, which is the engine's memory accounting (set per
# engine in cost/engine_serving.json with its source); times barely constrain it, and a fit that could raise it
# would shrink the KV cache to stand in for slow steps; nor a release's kernel time, 1 for the shared physics.
# The streaming cost has its own fit on the runs' operating
# points at their latency limits (serving/calibrate_stream.py), kept as set here
FITTED_TERMS = tuple(f.name for f in fields(ServingOverheads)
                     if f.name not in ("reserve_gb", "group_reserve_gb", "stream_us", "kernel_time"))
# a row off by more than 2x (|log error| 0.69) counts as 2x: a few runs no overhead explains (a setup the model
# misses) must not steer the engine's overheads for every other run
LOSS_CAP = math.log(2.0)


def loss(runs: list[PublishedRun], pool: PredictorPool, params: ServingOverheads) -> float:
    """Mean |log error| per metric, then over metrics. A run these overheads refuse (its KV cache no longer
    holds one request) ran all the same: each of its measured metrics counts at the cap, so a fit cannot
    leave the rows it gets wrong out of its own loss."""
    per_metric: dict[str, list[float]] = defaultdict(list)
    for run, pred, _ in pool.map(runs, params):
        for m, v in run.measured.items():
            if v <= 0:
                continue
            if pred is None:
                per_metric[m].append(LOSS_CAP)
            elif pred.get(m, 0) > 0:
                per_metric[m].append(min(LOSS_CAP, abs(math.log(pred[m] / v))))
    parts = [sum(v) / len(v) for v in per_metric.values() if v]
    return sum(parts) / len(parts) if parts else float("inf")


def coordinate_search(runs, pool, start: ServingOverheads, names, rounds: int = 3, log=print):
    best, best_loss = start, loss(runs, pool, start)
    bounds = {f.name: f.metadata["bounds"] for f in fields(ServingOverheads)}
    for r in range(rounds):
        for name in names:
            lo, hi = bounds[name]
            # a term bounded within 10x is a ratio near 1 (a release's kernel time): steps of 4x would only
            # reach its bounds
            factor = ((1.4, 1.2, 1.1) if lo > 0 and hi / lo <= 10 else (4.0, 2.0, 1.4))[min(r, 2)]
            value = getattr(best, name)
            trials = {min(hi, max(lo, value * f)) for f in (1 / factor, factor)} | ({lo} if value == 0 else set())
            if value == 0:
                trials |= {min(hi, max(lo, x)) for x in (0.1 * hi, 0.01 * hi)}
            for v in sorted(trials):
                if v == value:
                    continue
                cand = replace(best, **{name: v})
                cand_loss = loss(runs, pool, cand)
                if cand_loss < best_loss - 1e-5:
                    best, best_loss = cand, cand_loss
                    log(f"  round {r + 1}: {name} = {v:.4g}: loss {cand_loss:.4f}")
    return best, best_loss


def oldest_kernel_release(engine: str) -> str | None:
    """The oldest release any bundled profile's kernel fit for `engine` timed (`engines.<engine>.release`)."""
    found = []
    for path in sorted(profiles_dir().glob("*.json")):
        entry = (json.loads(path.read_text()).get("engines") or {}).get(engine)
        if isinstance(entry, dict) and entry.get("release"):
            found += entry["release"].split("/")
    return min(found, key=release_key) if found else None


def release_terms(engine: str, release: str) -> tuple[str, ...]:
    """The terms `release` may take. Its own kernel time only where it is older than every kernel table the
    engine's fits timed: a release within their span runs the kernels they timed."""
    oldest = oldest_kernel_release(engine)
    if oldest is None or release_key(release) >= release_key(oldest):
        return tuple(t for t in RELEASE_TERMS if t != "kernel_time")
    return RELEASE_TERMS


def fitted_kernels(run: PublishedRun) -> bool:
    """The run's device has the engine's own kernel fit (not carried over from another device or engine)."""
    cal = load_profile(run.device).engine(run.engine)
    return cal.origin.startswith("fitted") and not cal.origin.startswith("no ")


def split(runs: list[PublishedRun], fraction: float, seed: int) -> tuple[list, list]:
    rng = random.Random(seed)
    order = list(range(len(runs)))
    rng.shuffle(order)
    cut = max(1, int(len(runs) * fraction))
    return [runs[i] for i in sorted(order[:cut])], [runs[i] for i in sorted(order[cut:])]


def fit_releases(runs: list[PublishedRun], pool: PredictorPool, fraction: float, seed: int, demand: float,
                 rounds: int = 3, log=print, start: ServingOverheads | None = None,
                 only: set[str] | None = None) -> dict:
    """The shared overheads, then each release's own terms. `only`: refit those releases' terms alone, over the
    shared overheads `start` as they are (a new release's rows, without refitting every other release)."""
    by_release: dict[str, list[PublishedRun]] = defaultdict(list)
    for run in runs:
        if run.release is not None:
            by_release[run.release].append(run)
    parts = {rel: split(rs, fraction, seed) for rel, rs in by_release.items() if len(rs) >= 4}
    if only is not None:
        parts = {rel: part for rel, part in parts.items() if rel in only}
        shared = start or ServingOverheads()
        log(f"releases {', '.join(sorted(parts, key=release_key)) or 'none'} over the shared overheads as set")
    else:
        fit_rows = [r for f, _ in parts.values() for r in f]
        log(f"shared fit on {len(fit_rows)} rows of releases {', '.join(sorted(parts, key=release_key))}")
        shared, _ = coordinate_search(fit_rows, pool, start or ServingOverheads(), FITTED_TERMS, rounds, log)
    releases = {}
    for rel in sorted(parts, key=release_key):
        fit, held = parts[rel]
        base_loss = loss(fit, pool, shared)
        own, own_loss, terms = shared, base_loss, {}
        for name in release_terms(runs[0].engine, rel):   # greedily, one at a time, kept only where demanded
            cand, cand_loss = coordinate_search(fit, pool, own, [name], rounds, log=lambda m: None)
            if cand_loss < own_loss - demand:
                own, own_loss, terms[name] = cand, cand_loss, getattr(cand, name)
        held_defaults = loss(held, pool, ServingOverheads())
        held_shared, held_own = loss(held, pool, shared), loss(held, pool, own)
        log(f"release {rel}: {len(fit)} fitted, {len(held)} held out; own terms {terms or 'none'}; held-out "
            f"{held_defaults:.3f} (defaults) -> {held_shared:.3f} (shared) -> {held_own:.3f} (with own terms)")
        releases[rel] = {"params": {k: round(v, 4) for k, v in terms.items()}, "fitted_rows": len(fit),
                         "held_out_rows": len(held), "held_out_loss": round(held_own, 4),
                         "sources": sorted({r.source_kind for r in by_release[rel]})}
    return {"shared": {"params": {f.name: round(getattr(shared, f.name), 4) for f in fields(ServingOverheads)}},
            "releases": releases}


def _bundled(engine: str) -> dict:
    """The engine's entry of the bundled cost/engine_serving.json ({} when it has none)."""
    return json.loads((resources.files("cost") / "engine_serving.json").read_text()).get(engine) or {}


def _current_shared(engine: str) -> ServingOverheads | None:
    """The bundled fit's shared overheads, where the engine has its own: the search starts there."""
    shared = (_bundled(engine).get("shared") or {}).get("params")
    return ServingOverheads.from_json(shared, f"engine_serving.json:{engine}") if shared else None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m serving.calibrate_overheads", description=__doc__.split("\n")[0])
    p.add_argument("--data", nargs="+", default=sorted(str(f) for f in DEV_SET.glob("*.jsonl")),
                   help="JSONL files of end-to-end runs (default: every file of ../shared/measurements/e2e)")
    p.add_argument("--engine", default="trtllm", choices=list(ENGINES), help="engine whose rows to fit")
    p.add_argument("--fit-fraction", type=float, default=0.5, help="share of each release's rows fitted")
    p.add_argument("--seed", type=int, default=0, help="seed of the fit/held-out split")
    p.add_argument("--demand", type=float, default=0.02,
                   help="loss a release's own term must remove to be kept (default 0.02)")
    p.add_argument("--rounds", type=int, default=3, help="coordinate-search rounds (default 3)")
    p.add_argument("--jobs", type=int, default=1, help="processes pricing rows in parallel (default 1)")
    p.add_argument("--release", nargs="+", default=None,
                   help="refit only these releases' own terms over the bundled shared overheads, keeping every "
                        "other release's fit (default: refit everything)")
    p.add_argument("--output", default="engine_serving.fitted.json", help="where to write (without --write)")
    p.add_argument("--write", action="store_true", help="store the fit in the bundled cost/engine_serving.json")
    args = p.parse_args(argv)
    missing = [d for d in args.data if not Path(d).is_file()]
    if missing or not args.data:
        print(f"error: {(missing or ['--data'])[0]}: no such file", file=sys.stderr)
        return 2
    if not 0 < args.fit_fraction < 1:
        print("error: --fit-fraction must be in (0, 1)", file=sys.stderr)
        return 2
    if args.jobs < 1 or args.rounds < 1 or not 0 <= args.demand < 1:
        print("error: --jobs and --rounds must be >= 1, --demand in [0, 1)", file=sys.stderr)
        return 2
    t0 = time.time()
    runs = [r for r in load_published(*args.data)[0] if r.engine == args.engine]
    runs = [r for r in runs if fitted_kernels(r)]
    if len(runs) < 4:
        print(f"error: {len(runs)} {args.engine} rows on devices with its kernel fits: too few to fit", file=sys.stderr)
        return 2
    log = lambda m: print(m, file=sys.stderr, flush=True)   # noqa: E731
    with PredictorPool(Predictor(), args.jobs) as pool:
        result = fit_releases(runs, pool, args.fit_fraction, args.seed, args.demand, args.rounds, log,
                              _current_shared(args.engine), set(args.release) if args.release else None)
    if not result["releases"]:
        which = f"release {', '.join(args.release)}" if args.release else "release"
        print(f"error: no {which} of {args.engine} has 4 rows that name it", file=sys.stderr)
        return 2
    names = ", ".join(Path(d).name for d in args.data)
    current = _bundled(args.engine)
    if args.release:     # the other releases' fits and the shared overheads stay as bundled
        for rel in result["releases"].values():
            rel["refit"] = "alone, over the shared overheads as bundled (--release)"
        result = {"shared": current.get("shared", result["shared"]),
                  "releases": {**current.get("releases", {}), **result["releases"]}}
        result["releases"] = dict(sorted(result["releases"].items(), key=lambda kv: release_key(kv[0])))
    if args.release and current.get("origin"):     # the shared overheads' origin; each refitted release says so
        origin = current["origin"]
    else:
        origin = (f"fitted by python -m serving.calibrate_overheads on "
                  f"{sum(r['fitted_rows'] for r in result['releases'].values())} {ENGINES[args.engine].label} rows of "
                  f"{names} (seed {args.seed}, fit fraction {args.fit_fraction:g}, demand {args.demand:g})")
    entry = {"origin": origin, **result}
    for kept in [k for k in current if k not in entry]:   # what the fit does not set (terms kept, their sources)
        entry[kept] = current[kept]
    for rel, r in result["releases"].items():
        print(f"{ENGINES[args.engine].label} {rel}: held-out mean |log error| {r['held_out_loss']:.3f} over "
              f"{r['held_out_rows']} rows; own terms: {', '.join(r['params']) or 'none'}")
    target = Path(str(resources.files("cost") / "engine_serving.json")) if args.write else Path(args.output)
    data = json.loads(target.read_text()) if target.exists() else {}
    data[args.engine] = entry
    target.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {target} ({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
