"""Whole-batch latency (text_generate --output-length) against the ROCm vLLM batch-latency tables.

    python bench/batch_latency.py [--data ../shared/measurements/e2e/mlperf_rocm_dev.jsonl] [--rows] [--json]
        [--no-chunked-prefill]

Each `rocm_vllm_devdocker_latency` row (benchmark_latency.py: one batch of `batch_size` requests, fixed input
and output lengths, the whole batch's time) is mapped to a tracecost setup by serving/published_rows.py (model,
MI300X profile, vLLM release, FP8 weights and KV, TP 8, the engine's limits) and walked step by step by
serving/batch_latency.py, the same walk `text_generate --output-length` prints. vLLM 0.6 rows are walked as
V0 runs on ROCm (whole prompts, no chunked prefill: `text_generate --no-chunked-prefill --max-prefill-tokens
131072 --max-running 256`); later releases with the engine's defaults. The report gives the median,
p90 and max absolute error of the batch latency per vLLM release and model. MI300X's device scaling was fitted
on vLLM 0.8.5 rows (hw_profiles/mi300x.json engines.serving_fit), among them its latency rows: the 0.6 rows
are the ones that fit did not see.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from serving.published import Predictor, load_published  # noqa: E402

DEFAULT_DATA = str(Path(__file__).resolve().parents[2] / "shared" / "measurements" / "e2e" / "mlperf_rocm_dev.jsonl")
SOURCE = "rocm_vllm_devdocker_latency"


def predict_rows(data: str, chunked: bool | None) -> list[dict]:
    runs, _ = load_published(data)
    predictor, out = Predictor(), []
    for run in (r for r in runs if r.source_kind == SOURCE and "e2e_latency_ms" in r.measured):
        if chunked is not None:      # every row chunked, or none, at the engine's budget
            run = replace(run, chunked_prefill=chunked)
        walk, rule = predictor.batch(run)
        predicted = walk.latency_s * 1e3
        out.append({"id": run.id, "model": run.model, "release": f"vllm {run.release}", "batch": run.load.requests,
                    "isl": run.isl, "osl": run.osl, "measured_ms": run.measured["e2e_latency_ms"],
                    "predicted_ms": predicted, "error": predicted / run.measured["e2e_latency_ms"] - 1,
                    "ttft_ms": walk.stats(walk.ttft_s)["mean"] * 1e3,
                    "tpot_ms": walk.stats(walk.tpot_s).get("mean", 0.0) * 1e3, "scheduler": rule})
    return out


def summary(rows: list[dict]) -> list[dict]:
    groups: dict = defaultdict(list)
    for r in rows:
        for key in ("all", r["release"], f"{r['release']} / {r['model']}", f"isl {r['isl']}"):
            groups[key].append(r["error"])
    out = []
    for key, errs in groups.items():
        a = np.abs(errs)
        out.append({"group": key, "rows": len(errs), "median": float(np.median(a)),
                    "p90": float(np.percentile(a, 90)), "max": float(a.max()),
                    "signed_median": float(np.median(errs))})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=DEFAULT_DATA)
    p.add_argument("--rows", action="store_true", help="print every row's prediction")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-chunked-prefill", dest="chunked", action="store_false", default=None,
                   help="every row without chunked prefill at the engine's budget (default: V0 releases as V0 on "
                        "ROCm runs them, whole prompts; later releases chunked at the engine's defaults)")
    p.add_argument("--chunked-prefill", dest="chunked", action="store_true",
                   help="every row chunked at the engine's defaults, V0 releases too")
    args = p.parse_args(argv)
    rows = predict_rows(args.data, args.chunked)
    groups = summary(rows)
    if args.json:
        print(json.dumps({"rows": rows, "summary": groups}, indent=1))
        return 0
    if args.rows:
        print("| row | batch | isl/osl | measured ms | predicted ms | error |\n|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['id']} | {r['batch']} | {r['isl']}/{r['osl']} | {r['measured_ms']:,.0f} | "
                  f"{r['predicted_ms']:,.0f} | {r['error']:+.1%} |")
        print()
    print("| group | rows | median | p90 | max | signed median |\n|---|---|---|---|---|---|")
    for g in groups:
        print(f"| {g['group']} | {g['rows']} | {g['median']:.1%} | {g['p90']:.1%} | {g['max']:.1%} | "
              f"{g['signed_median']:+.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
