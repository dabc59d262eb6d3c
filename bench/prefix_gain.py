"""What prefix caching buys under load: throughput with a shared prefix over throughput without, against the
engine measurements issue 10 quotes (a 2000-token shared prefix + 1200 unique tokens against 3200 unique,
concurrency 32-128, H200 and MI300X: 1.18-1.69x, median 1.27).

    python bench/prefix_gain.py [--model llama-3.1-70b] [--device h200] [--tp 8] [--verify] [--json]

The measured runs do not state their model or output length; the default setup is a guess (Llama-3.1-70B on
8 x H200, TP8, vLLM) at two output lengths. Each point is the steady-state model at C concurrent users
(`throughput_optimizer --concurrency C`), with the prefix stored once in the KV cache (`--shared-prefix-kv`);
`--verify` also runs the event simulator on both setups.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cli.common import positive_int, run_main  # noqa: E402
from cli.inference.optimizer_flags import int_list  # noqa: E402
from cost.engines import DEFAULT_ENGINE, ENGINES  # noqa: E402
from cost.profile import load_profile  # noqa: E402
from serving.layouts import Layout  # noqa: E402
from serving.search import EngineSettings, LatencyLimits, Searcher, Workload  # noqa: E402
from serving.steady_state import CONCURRENCY, Load  # noqa: E402
from serving.verify import simulate_candidate  # noqa: E402
from tracer import TraceOptions, resolve_model  # noqa: E402

SHARED, UNIQUE = 2000, 1200
MEASURED = {"low": 1.18, "median": 1.27, "high": 1.69}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="llama-3.1-70b")
    p.add_argument("--device", default="h200")
    p.add_argument("--tp", type=positive_int, default=8)
    p.add_argument("--engine", default=DEFAULT_ENGINE, choices=list(ENGINES))
    p.add_argument("--outputs", type=int_list, default=[1024, 256], help="output lengths to try (comma-separated)")
    p.add_argument("--concurrency", type=int_list, default=[32, 64, 128])
    p.add_argument("--verify", action="store_true", help="also simulate both setups")
    p.add_argument("--json", action="store_true")
    return run_main(measure, p.parse_args(argv))   # a bad model, device or setup: one line, exit 2


def measure(args) -> int:
    spec, hw = resolve_model(args.model), load_profile(args.device)
    settings = EngineSettings(engine=args.engine)
    layout = Layout(args.tp)
    rows = []
    for output in args.outputs:
        shared = Searcher(spec, hw, TraceOptions(), Workload(SHARED + UNIQUE, output, SHARED, True), settings,
                          LatencyLimits())
        unique = Searcher(spec, hw, TraceOptions(), Workload(SHARED + UNIQUE, output, 0), settings, LatencyLimits())
        for users in args.concurrency:
            load = Load(CONCURRENCY, users)
            hit, miss = shared.mixed(layout, load), unique.mixed(layout, load)
            row = {"output": output, "concurrency": users, "gain": hit.output_tokens_per_s / miss.output_tokens_per_s,
                   "tokens_per_s": [hit.output_tokens_per_s, miss.output_tokens_per_s]}
            if args.verify:
                a, b = simulate_candidate(shared, hit, load), simulate_candidate(unique, miss, load)
                row["sim_gain"] = a["output_tokens_per_s"] / b["output_tokens_per_s"]
            rows.append(row)
            print(f"output {output}, C={users}: {row['gain']:.2f}x"
                  + (f" (simulated {row['sim_gain']:.2f}x)" if args.verify else ""), file=sys.stderr, flush=True)
    by_output = {o: statistics.median(r["gain"] for r in rows if r["output"] == o)
                 for o in dict.fromkeys(r["output"] for r in rows)}
    if args.json:
        print(json.dumps({"setup": vars(args), "measured": MEASURED, "rows": rows, "median_by_output": by_output},
                         indent=1))
        return 0
    print(f"{args.model} on {args.tp} x {hw.name} ({args.engine}), {SHARED}-token shared prefix + {UNIQUE} unique "
          f"vs {SHARED + UNIQUE} unique; measured (other setups): {MEASURED['low']}-{MEASURED['high']}x, "
          f"median {MEASURED['median']}x\n")
    print("| output | concurrency | gain" + (" | simulated gain |" if args.verify else " |"))
    print("|---|---|---|" + ("---|" if args.verify else ""))
    for r in rows:
        print(f"| {r['output']} | {r['concurrency']} | {r['gain']:.2f}x |"
              + (f" {r['sim_gain']:.2f}x |" if args.verify else ""))
    for o, g in by_output.items():
        print(f"\noutput {o}: median {g:.2f}x ({g / MEASURED['median'] - 1:+.0%} against the measured median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
