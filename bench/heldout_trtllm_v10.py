"""Held out: TensorRT-LLM 1.0's performance overview, a release no fit saw.

    python bench/heldout_trtllm_v10.py [--jobs 2] [--json]

bench/data/trtllm_v10_perf_overview.jsonl transcribes the max-throughput tables of TensorRT-LLM's v1.0 performance
overview (210 rows: Llama-3.1 8B/70B/405B, Llama-4 Scout and Maverick, Qwen3-30B-A3B and 235B-A22B on H100, H200,
B200 and GB200). No step overhead was fitted on 1.0; its rows take 0.20's, the nearest older release with data, and
the MoE kernels of 1.0 where a device has tables of that release (hw_profiles engines.trtllm.releases).

The page runs its MoE models with `--ep` and attention DP, and states neither value beside its tables. Each MoE row
with TP > 1 is therefore priced three ways, none chosen by fit: as the table states it (TP only), with EP = TP, and
with EP = TP under attention DP (one DP rank per GPU), each row read through serving/published_rows.py as if it
stated that layout.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cli.common import positive_int  # noqa: E402
from serving.published import Predictor, PredictorPool, load_published, map_row  # noqa: E402
from serving.published_rows import MODELS  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "trtllm_v10_perf_overview.jsonl"
READINGS = ("as stated (TP)", "EP = TP", "EP = TP, attention DP")
MOE_MODELS = {"llama-4-scout", "llama-4-maverick", "qwen3-30b-a3b", "qwen3-235b-a22b"}


def read(row: dict, reading: str) -> dict:
    """The row as `reading` lays out its MoE layers (dense rows and one-GPU rows are as stated), for map_row."""
    if MODELS.get(row["model"]) not in MOE_MODELS or row["tp"] == 1 or reading == READINGS[0]:
        return row
    if reading == READINGS[1]:
        return {**row, "ep": row["tp"]}
    return {**row, "ep": row["tp"], "dp": row["tp"], "attention_dp": True}


def summary(errors: list[float]) -> dict:
    a = np.asarray(errors)
    return {"rows": len(a), "median": float(np.median(np.abs(a))), "signed_median": float(np.median(a))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=positive_int, default=1, help="processes pricing rows in parallel (default 1)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    runs, skipped = load_published(str(DATA))
    groups: dict = defaultdict(list)
    with PredictorPool(Predictor(), args.jobs) as pool:
        for reading in READINGS:
            read_runs = [run for run, _ in (map_row(read(r, reading)) for r in rows) if run is not None]
            for run, pred, error in pool.map(read_runs):
                if error:
                    print(f"{run.id}: {error}", file=sys.stderr)
                    continue
                e = pred["output_tok_s"] / run.measured["output_tok_s"] - 1
                kind = "MoE" if run.model in MOE_MODELS else "dense"
                for key in ((reading, kind, "all"), (reading, kind, run.device), (reading, run.model, run.device)):
                    groups[key].append(e)
    out = {" / ".join(k): summary(v) for k, v in sorted(groups.items(), key=lambda kv: (READINGS.index(kv[0][0]),
                                                                                       kv[0][1:]))}
    if args.json:
        print(json.dumps({"rows": len(runs), "skipped": skipped, "groups": out}, indent=1))
        return 0
    print(f"TensorRT-LLM 1.0 performance overview, {len(runs)} rows ({len(skipped)} skipped), output tokens/s\n")
    print("| reading | group | GPU | rows | median | signed median |\n|---|---|---|---|---|---|")
    for (reading, group, gpu), values in sorted(groups.items(), key=lambda kv: (READINGS.index(kv[0][0]),
                                                                                kv[0][1] not in ("dense", "MoE"),
                                                                                kv[0][1:])):
        if reading != READINGS[0] and group not in MOE_MODELS and group != "MoE":
            continue        # the readings differ only for MoE rows
        s = summary(values)
        print(f"| {reading} | {group} | {gpu} | {s['rows']} | {s['median'] * 100:.1f}% | "
              f"{s['signed_median'] * 100:+.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
