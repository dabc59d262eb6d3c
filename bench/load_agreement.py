"""The highest request rate within p99 TTFT and TPOT limits: the steady-state model against event simulations.

    python bench/load_agreement.py [--model llama-3.2-1b] [--device h100] [--json]

For each case the optimizer's answer (serving/search.py best_rate) is bisected in the simulator
(serving/verify.py simulated_best_rate: converged open-loop Poisson runs of the same layout, engine limits, KV
capacity and lengths). Cases: fixed lengths near compute saturation, at a small max_num_seqs and with a small KV
cache (vLLM's blocks allocated as tokens come), and the MLPerf Llama-2-70B and Mixtral length mixes
(serving/data/length_sets.json) with a small and the default max_num_seqs.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cost.profile import load_profile  # noqa: E402
from serving.layouts import Layout  # noqa: E402
from serving.lengths import read_lengths  # noqa: E402
from serving.search import EngineSettings, LatencyLimits, Searcher, Workload  # noqa: E402
from serving.verify import simulated_best_rate  # noqa: E402
from tracer import TraceOptions, resolve_model  # noqa: E402
from tracer.table import format_table  # noqa: E402

CASES = [  # (label, lengths: "I/O" or a bundled set, max_num_seqs, memory fraction, TTFT p99 ms, TPOT p99 ms)
    ("fixed 1000/128", "1000/128", None, None, 100, 15),
    ("fixed 1000/128, 64 slots", "1000/128", 64, None, 300, 15),
    ("fixed 200/800, KV-bound (6% of memory)", "200/800", None, 0.06, 1000, 30),
    ("mlperf-llama2-70b, 64 slots", "mlperf-llama2-70b", 64, None, 100, 15),
    ("mlperf-llama2-70b", "mlperf-llama2-70b", None, None, 100, 15),
    ("mlperf-mixtral-8x7b, 128 slots", "mlperf-mixtral-8x7b", 128, None, 200, 15),
]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="llama-3.2-1b")
    p.add_argument("--device", default="h100")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    spec, hw = resolve_model(args.model), load_profile(args.device)
    rows, out = [], []
    for label, lengths, seqs, fraction, ttft, tpot in CASES:
        if "/" in lengths:
            i, o = (int(x) for x in lengths.split("/"))
            w = Workload(i, o)
        else:
            d = read_lengths(lengths)
            w = Workload(round(d.mean_input), round(d.mean_output), lengths=d)
        s = Searcher(spec, hw, TraceOptions(), w, EngineSettings(max_num_seqs=seqs, memory_fraction=fraction),
                     LatencyLimits(ttft, tpot, "p99"))
        t = time.time()
        best = s.best_rate(Layout(1))
        rate, sim = simulated_best_rate(s, Layout(1), best.request_rate)
        r = {"case": label, "limits_ms": [ttft, tpot], "model_rate": best.request_rate, "sim_rate": rate,
             "model_ttft_p99": best.ttft_ms["p99"], "model_tpot_p99": best.tpot_stats_ms["p99"],
             "sim_ttft_p99": sim["ttft_ms"]["p99"] if sim else None,
             "sim_tpot_p99": sim["tpot_q_ms"]["p99"] if sim else None, "seconds": time.time() - t}
        out.append(r)
        rows.append([label, f"{ttft}/{tpot}", f"{r['model_rate']:.1f}", f"{rate:.1f}",
                     f"{(r['model_rate'] / rate - 1) * 100:+.1f}%" if rate else "-",
                     f"{r['model_ttft_p99']:.1f} / {r['model_tpot_p99']:.2f}",
                     f"{r['sim_ttft_p99']:.1f} / {r['sim_tpot_p99']:.2f}" if sim else "-"])
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(format_table(["case", "p99 limits ms", "model req/s", "sim req/s", "model vs sim",
                            "model p99 TTFT / TPOT", "sim p99 TTFT / TPOT (at sim rate)"], rows,
                           title=f"{args.model} on {hw.name}, TP1, highest rate within the p99 limits"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
