"""End-to-end serving accuracy against published serving runs (the development set).

    python bench/e2e_accuracy.py [--data ../shared/measurements/e2e/published.jsonl] [--json] [--rows]
        [--sample K] [--device D] [--precision P] [--overheads fitted|defaults]

Each row is mapped to a tracecost setup (serving/published_rows.py: same model, GPU, engine, precision, KV dtype,
layout, lengths and load) and predicted with the steady-state serving model: open-loop rows at their
request rate over their number of requests, max-throughput rows as every request queued at once. The
report gives, per source, GPU and model, the median, p90 and max absolute error and the signed median of
TTFT, TPOT (mean ITL where the row reports that) and output tokens/s.
"""
from __future__ import annotations

import argparse
from dataclasses import replace
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cli.common import positive_int  # noqa: E402
from cost.engines import ServingOverheads  # noqa: E402
from cost.profile import load_profile  # noqa: E402
from serving.published import METRICS, Predictor, PredictorPool, load_published, rate_within_limits  # noqa: E402

DEFAULT_DATA = sorted(str(p) for p in (Path(__file__).resolve().parents[2] / "shared" / "measurements" / "e2e").glob("*.jsonl"))


def release_label(run) -> str:
    """A row's engine release as the groups name it ("vllm 0.11"; MLPerf's TensorRT-LLM rows name only a commit)."""
    return f"{run.engine} {run.release or '(commit only)'}"


def errors(rows: list[tuple]) -> dict:
    """rows: (run, predicted dict) -> {(group...): {metric: [signed relative errors]}}"""
    out: dict = defaultdict(lambda: defaultdict(list))
    for run, pred in rows:
        for m in METRICS:
            if m in run.measured and m in pred:
                e = pred[m] / run.measured[m] - 1
                for key in (("all",), (run.source_kind,), ("release", release_label(run)),
                            (run.source_kind, run.device), (run.source_kind, run.device, run.model)):
                    out[key][m].append(e)
    return out


def stats(values: list[float]) -> dict:
    a = np.abs(values)
    return {"n": len(values), "median": float(np.median(a)), "p90": float(np.percentile(a, 90)),
            "max": float(a.max()), "signed_median": float(np.median(values))}


# issue 19's target for every source and release: output tokens/s median |error| and |signed median|
TARGET_MEDIAN, TARGET_SIGNED = 0.08, 0.05


def targets(rows: list[tuple]) -> list[dict]:
    """Output tokens/s per (source, engine release) against issue 19's target."""
    groups: dict = defaultdict(list)
    for run, pred in rows:
        if "output_tok_s" in run.measured and "output_tok_s" in pred:
            error = pred["output_tok_s"] / run.measured["output_tok_s"] - 1
            groups[(run.source_kind, release_label(run))].append(error)
    out = []
    for (source, release), v in sorted(groups.items()):
        s = stats(v)
        out.append({"source": source, "release": release, **s,
                    "met": s["median"] <= TARGET_MEDIAN and abs(s["signed_median"]) <= TARGET_SIGNED})
    return out


def target_table(found: list[dict]) -> str:
    lines = [f"| source | release | rows | median | signed median | median <= {TARGET_MEDIAN:.0%}, "
             f"abs(signed) <= {TARGET_SIGNED:.0%} |", "|---|---|---|---|---|---|"]
    lines += [f"| {t['source']} | {t['release']} | {t['n']} | {t['median']:.1%} | {t['signed_median']:+.1%} | "
              f"{'met' if t['met'] else 'missed'} |" for t in found]
    return "\n".join(lines)


# issue 19's other checks: the highest rate within the p99 limits (MLPerf Server/Interactive) within 10% of the
# submitter's, the mean TTFT and TPOT at the submitter's rate within 25%, and MI300X fitted on one vLLM release
# within 12% on the others' rows
RATE_TARGET, EXACT_RATE_TARGET, HELD_OUT_TARGET = 0.10, 0.25, 0.12


def fitted_row_ids(device: str) -> set[str]:
    """The development rows a device's committed serving fit was fitted on (its profile's record of the fit)."""
    fit = load_profile(device).engines_data.get("serving_fit") or {}
    return set((fit.get("source") or {}).get("fitted_rows") or [])


def scorecard(rows: list[tuple], rates: list[tuple]) -> list[dict]:
    """Each of issue 19's "done when" checks the bench can measure, per source (or release): the value, its target
    and whether it is met."""
    out = []
    found = targets(rows)
    out.append({"check": "output tokens/s per source and engine release", "group": "all",
                "value": f"{sum(t['met'] for t in found)} of {len(found)} met",
                "target": f"median <= {TARGET_MEDIAN:.0%}, abs(signed) <= {TARGET_SIGNED:.0%}",
                "met": all(t["met"] for t in found)})
    by_source: dict = defaultdict(list)
    for run, predicted, submitted, *_ in rates:
        by_source[run.source_kind].append(predicted / submitted - 1)
    for source, v in sorted(by_source.items()):
        s = stats(v)
        out.append({"check": "highest rate within the p99 limits", "group": source, "value": f"{s['median']:.1%}",
                    "target": f"<= {RATE_TARGET:.0%}", "met": s["median"] <= RATE_TARGET})
    exact: dict = defaultdict(lambda: defaultdict(list))
    for run, pred in rows:
        if run.latency_limits and run.load.kind == "rate":
            for m in ("ttft_ms", "tpot_ms"):
                if m in run.measured and m in pred:
                    exact[run.source_kind][m].append(pred[m] / run.measured[m] - 1)
    for source, ms in sorted(exact.items()):
        for m, v in ms.items():
            s = stats(v)
            out.append({"check": f"mean {m.split('_')[0].upper()} at the submitter's rate", "group": source,
                        "value": f"{s['median']:.1%}", "target": f"<= {EXACT_RATE_TARGET:.0%}",
                        "met": s["median"] <= EXACT_RATE_TARGET})
    fitted = fitted_row_ids("mi300x")
    held: dict = defaultdict(list)
    for run, pred in rows:
        if run.device == "mi300x" and run.engine == "vllm" and fitted and run.id not in fitted:
            for m, v in run.measured.items():
                if m in pred:
                    held[(run.release, m)].append(pred[m] / v - 1)
    for (release, metric), v in sorted(held.items()):
        s = stats(v)
        out.append({"check": "MI300X held out from its one-release fit", "group": f"vllm {release}, {metric}",
                    "value": f"{s['median']:.1%}", "target": f"<= {HELD_OUT_TARGET:.0%}",
                    "met": s["median"] <= HELD_OUT_TARGET})
    return out


def scorecard_table(checks: list[dict]) -> str:
    lines = ["| check | group | value | target | |", "|---|---|---|---|---|"]
    lines += [f"| {c['check']} | {c['group']} | {c['value']} | {c['target']} | {'met' if c['met'] else 'missed'} |"
              for c in checks]
    return "\n".join(lines)


def table(errs: dict) -> str:
    lines = ["| group | metric | rows | median | p90 | max | signed median |", "|---|---|---|---|---|---|---|"]
    for key in sorted(errs, key=lambda k: (len(k) > 1, k)):
        for m, v in errs[key].items():
            s = stats(v)
            lines.append(f"| {' / '.join(key)} | {m} | {s['n']} | {s['median']:.1%} | {s['p90']:.1%} | "
                         f"{s['max']:.1%} | {s['signed_median']:+.1%} |")
    return "\n".join(lines)


def predict_all(runs, predictor: Predictor, overheads: ServingOverheads | None = None, progress: bool = True,
                jobs: int = 1):
    """Every run's prediction; `jobs` > 1 prices rows in forked processes (each keeps its own warm caches)."""
    out, t0 = [], time.time()
    with PredictorPool(predictor, jobs) as pool:
        for i, (run, pred, error) in enumerate(pool.map(runs, overheads)):
            if error is not None:      # a row tracecost cannot price: reported, never hidden
                print(f"{run.id}: not predicted: {error}", file=sys.stderr)
                continue
            out.append((run, pred))
            if progress and sys.stderr.isatty():
                print(f"\r{i + 1}/{len(runs)} rows, {time.time() - t0:.0f} s", end="", file=sys.stderr, flush=True)
    if progress and sys.stderr.isatty():
        print(file=sys.stderr)
    return out


def at_rate(predictor: Predictor, run, rate: float) -> dict:
    """The predicted means of `run` at `rate` requests/s (whole deployment) instead of its own."""
    return predictor.predict(replace(run, load=replace(run.load, value=rate / run.replicas)))[0]


def limit_rates(runs, predictor: Predictor) -> list[tuple]:
    """(run, predicted highest rate within the p99 limits, the submitter's rate, the predicted means at that
    highest rate, how steeply the predicted mean TPOT moves with the rate at the submitter's: d ln TPOT / d ln rate
    over +-2%) for rows with latency limits."""
    out = []
    for run in runs:
        if run.latency_limits and run.load.kind == "rate":
            submitted = run.load.value * run.replicas
            try:
                highest = rate_within_limits(predictor, run)
                at_limit = at_rate(predictor, run, highest) if highest > 0 else {}
                lo, hi = at_rate(predictor, run, submitted * 0.98), at_rate(predictor, run, submitted * 1.02)
                steepness = float(np.log(hi["tpot_ms"] / lo["tpot_ms"]) / np.log(1.02 / 0.98))
                out.append((run, highest, submitted, at_limit, steepness))
            except (ValueError, RuntimeError) as e:
                print(f"{run.id}: no rate within limits: {e}", file=sys.stderr)
    return out


def limits_table(rates: list[tuple]) -> str:
    groups: dict = defaultdict(list)
    for run, predicted, submitted, *_ in rates:
        scenario = run.id.rsplit("-", 1)[-1]
        for key in (("all",), (run.source_kind, scenario), (run.source_kind, scenario, run.device)):
            groups[key].append(predicted / submitted - 1)
    lines = ["| group | rows | median | p90 | max | signed median |", "|---|---|---|---|---|---|"]
    for key in sorted(groups, key=lambda k: (len(k) > 1, k)):
        s = stats(groups[key])
        lines.append(f"| {' / '.join(key)} | {s['n']} | {s['median']:.1%} | {s['p90']:.1%} | {s['max']:.1%} | "
                     f"{s['signed_median']:+.1%} |")
    return "\n".join(lines)


def operating_point_table(rates: list[tuple]) -> str:
    """Mean TTFT and TPOT where each side's p99 limits stop the load: predicted at the predicted highest rate,
    measured at the submitter's; and how steep the predicted TPOT is in the rate at the submitter's rate."""
    groups: dict = defaultdict(lambda: defaultdict(list))
    for run, _, _, at_limit, steepness in rates:
        scenario = run.id.rsplit("-", 1)[-1]
        for key in (("all",), (run.source_kind, scenario), (run.source_kind, scenario, run.model)):
            for m in ("ttft_ms", "tpot_ms"):
                if m in at_limit and m in run.measured:
                    groups[key][m].append(at_limit[m] / run.measured[m] - 1)
            groups[key]["steepness"].append(steepness)
    lines = ["| group | rows | mean TTFT median (signed) | mean TPOT median (signed) | d ln TPOT / d ln rate, median |",
             "|---|---|---|---|---|"]
    for key in sorted(groups, key=lambda k: (len(k) > 1, k)):
        g = groups[key]
        cell = {m: (f"{stats(g[m])['median']:.1%} ({stats(g[m])['signed_median']:+.1%})" if g[m] else "-")
                for m in ("ttft_ms", "tpot_ms")}
        lines.append(f"| {' / '.join(key)} | {len(g['steepness'])} | {cell['ttft_ms']} | {cell['tpot_ms']} | "
                     f"{np.median(g['steepness']):.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", nargs="+", default=DEFAULT_DATA, help="JSONL files of runs (default: every file of the shared dev set)")
    p.add_argument("--sample", type=int, default=0, help="every K-th row only (quick checks)")
    p.add_argument("--device", default=None, help="only rows on this tracecost device (e.g. h100)")
    p.add_argument("--precision", default=None, help="only rows of this weight precision (e.g. fp8)")
    p.add_argument("--overheads", default="fitted", choices=["fitted", "defaults"],
                   help="engine overheads: the fitted ones (cost/engine_serving.json) or the unfitted defaults")
    p.add_argument("--rows", action="store_true", help="also print every row's prediction")
    p.add_argument("--no-limits", action="store_true",
                   help="skip the highest-rate-within-p99-limits check of the MLPerf Server/Interactive rows")
    p.add_argument("--jobs", type=positive_int, default=1, help="processes pricing rows in parallel (default 1)")
    p.add_argument("--mean-lengths", action="store_true",
                   help="price every row at its dataset's mean lengths, not its bundled per-request length set "
                        "(how much the distribution changes the answer)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    missing = [d for d in args.data if not Path(d).is_file()]
    if missing or not args.data:
        print(f"error: {(missing or ['--data'])[0]}: no such file (the development set lives in "
              f"../shared/measurements/e2e/)", file=sys.stderr)
        return 2
    runs, skipped = load_published(*args.data)
    runs = [r for r in runs if (args.device is None or r.device == args.device)
            and (args.precision is None or r.dtype == args.precision)]
    if not runs:
        print(f"error: no development rows on device {args.device!r} with precision {args.precision!r}",
              file=sys.stderr)
        return 2
    if args.sample > 1:
        runs = runs[::args.sample]
    if args.mean_lengths:
        runs = [replace(r, lengths=None) for r in runs]
    t0 = time.time()
    predictor = Predictor()
    rows = predict_all(runs, predictor, ServingOverheads() if args.overheads == "defaults" else None,
                       jobs=args.jobs)
    errs = errors(rows)
    rates = [] if args.no_limits else limit_rates(runs, predictor)
    if args.json:
        print(json.dumps({"rows": len(rows), "skipped": skipped, "seconds": time.time() - t0,
                          "set_aside": [{"id": r.id, "metric": m, "why": why} for r, _ in rows
                                        for m, why in r.set_aside.items()],
                          "groups": {" / ".join(k): {m: stats(v) for m, v in ms.items()} for k, ms in errs.items()},
                          "targets": targets(rows),
                          "scorecard": scorecard(rows, rates),
                          "rate_within_limits": [{"id": r.id, "predicted": p, "submitted": s, "at_predicted_rate": a,
                                                  "tpot_steepness": k} for r, p, s, a, k in rates],
                          "predictions": [{"id": r.id, "measured": r.measured, "predicted": pr} for r, pr in rows]},
                         indent=1))
        return 0
    print(f"{len(rows)} rows predicted in {time.time() - t0:.0f} s ({len(skipped)} skipped)\n")
    print(table(errs))
    print("\nOutput tokens/s per source and engine release against issue 19's target:\n")
    print(target_table(targets(rows)))
    aside = [(r.id, m, why) for r, _ in rows for m, why in r.set_aside.items()]
    if aside:
        print("\nNumbers set aside, not scored, because the row's own other numbers rule them out:\n")
        print("| id | metric | why |\n|---|---|---|")
        print("\n".join(f"| {i} | {m} | {why} |" for i, m, why in aside))
    if rates:
        print("\nHighest request rate within the p99 TTFT/TPOT limits, predicted against the submitter's rate:\n")
        print(limits_table(rates))
        print("\nMean TTFT and TPOT at the operating point the p99 limits allow (predicted at the predicted highest "
              "rate, measured at the submitter's), and the predicted TPOT's steepness in the rate at the "
              "submitter's rate:\n")
        print(operating_point_table(rates))
    print("\nIssue 19's checks (every development row this run predicted):\n")
    print(scorecard_table(scorecard(rows, rates)))
    if args.rows:
        print("\n| id | engine | model | gpu | tp | isl/osl | load | metric | predicted | measured | error |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r, pr in rows:
            load = (f"{r.load.value:g}/s" if r.load.kind == "rate" else
                    f"{r.load.value:g} users" if r.load.kind == "concurrency" else f"{r.load.requests} at once")
            for m, v in r.measured.items():
                print(f"| {r.id} | {release_label(r)} | {r.model} | {r.device} | {r.tp} | "
                      f"{r.isl}/{r.osl} | {load} | {m} | {pr[m]:.1f} | "
                      f"{v:.1f} | {pr[m] / v - 1:+.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
