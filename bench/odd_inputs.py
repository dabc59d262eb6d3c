"""Odd input of issue 23's classes through the CLIs, as subprocesses: each case listed with its outcome.

    python bench/odd_inputs.py [--jobs 2] [--timeout 60] [--only optimizer,plot,...] [--verbose]

Classes (bench/fuzz_inputs.py covers issue 13's; this adds the ones issue 23 found answered wrongly):
- optimizer: every numeric flag of the throughput optimizer at huge, inf and NaN, in both modes for --num-devices;
- limits: --ttft-limit / --tpot-limit at inf (must mean no limit: answered, same as no flag) and at -inf, 0, NaN;
- plot: a name without an extension or with one matplotlib cannot write, for the three CLIs that draw;
- combinations: flags that do not apply together (a sweep and a single rate, a distribution and a rate, a trace
  file and a preset's load flags) must be refused or warned about;
- context: a tracer or text_generate sequence beyond max_position_embeddings must warn.
Outcomes are bench/fuzz_inputs.py's: traceback, timeout, bad numbers, silent acceptance, ok (refused/answered).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fuzz_inputs import Case, classify  # noqa: E402 - the same classification as issue 13's fuzz

OPT, TG, SS, TR = "cli.inference.throughput_optimizer", "cli.inference.text_generate", "cli.inference.serving_sim", \
    "tracer"
HUGE = ["1e7", "1e12", "1e15", "inf", "nan"]


def cases(tmp: Path) -> dict[str, list[Case]]:
    base = ["llama-3.2-1b", "--device", "h100", "--input-length", "512", "--output-length", "64"]
    one = [*base, "--num-devices", "1"]
    sim = ["llama-3.2-1b", "--device", "h200", "--jobs", "1", "--json"]
    out: dict[str, list[Case]] = {}
    out["optimizer"] = [Case(OPT, f"--num-devices {v} --mode {m}", [*base, "--num-devices", v, "--mode", m])
                        for v in HUGE for m in ("mixed", "disagg")]
    out["optimizer"] += [Case(OPT, f"--nodes {v}", [*base, "--nodes", v]) for v in HUGE]
    for flag in ("--top", "--max-num-seqs", "--max-prefill-tokens", "--prefix-cache-block-size", "--input-length",
                 "--output-length", "--request-rate", "--concurrency", "--num-requests", "--verify",
                 "--kv-cache-tokens"):
        out["optimizer"] += [Case(OPT, f"{flag} {v}", [*one, flag, v]) for v in HUGE]
    out["limits"] = [Case(OPT, f"{flag} {v}", [*one, flag, v, "--json"]) for flag in ("--ttft-limit", "--tpot-limit")
                     for v in ("inf", "-inf", "0", "nan", "1e-300", "1e300")]
    drawers = {OPT: one, TG: ["llama-3.2-1b", "--device", "h200", "--sweep-prefix-cache-hit-rate", "0,0.5"],
               SS: [*sim, "--workload", "random", "--num-requests", "4"]}
    out["plot"] = [Case(cli, f"--plot {name}", [*argv, "--plot", str(tmp / name)])
                   for cli, argv in drawers.items() for name in ("frontier", "frontier.", "frontier.xyz", ".png")]
    rates = tmp / "rates.txt"
    rates.write_text("0.1\n0.9\n0.5\n")
    trace = tmp / "trace.jsonl"
    trace.write_text("".join(json.dumps({"arrival_s": t, "segments": [{"id": "s", "tokens": 64}],
                                         "output_tokens": 4}) + "\n" for t in (0.0, 0.1)))
    out["combinations"] = [
        Case(TG, "sweep with a single hit rate", ["llama-3.2-1b", "--device", "h200", "--sweep-prefix-cache-hit-rate",
                                                  "0,0.5", "--prefix-cache-hit-rate", "0.2"], True),
        Case(OPT, "distribution with a single hit rate", [*one, "--prefix-cache-hit-rate-distribution", str(rates),
                                                          "--prefix-cache-hit-rate", "0.2"], True),
        Case(OPT, "distribution with --request-rate", [*one, "--prefix-cache-hit-rate-distribution", str(rates),
                                                       "--request-rate", "5"], True),
        Case(OPT, "block larger than the hit tokens", [*one, "--prefix-cache-hit-rate", "0.5",
                                                       "--prefix-cache-block-size", "4096"], True),
        Case(OPT, "--concurrency with --request-rate", [*one, "--concurrency", "4", "--request-rate", "5"], True),
        Case(SS, "trace with --num-requests 1", [*sim, "--workload", str(trace), "--num-requests", "1"], True),
        Case(SS, "trace with --request-rate", [*sim, "--workload", str(trace), "--request-rate", "3"], True),
        Case(SS, "mooncake trace with --num-requests", [*sim, "--workload", f"mooncake:{trace}", "--num-requests",
                                                        "1"], True),
        Case(SS, "--concurrency with --request-rate", [*sim, "--workload", "random", "--concurrency", "2",
                                                       "--request-rate", "3"], True),
    ]
    out["context"] = [
        Case(TR, "prefill beyond max_position_embeddings", ["mistral-7b", "-q", "40000", "--json"], True),
        Case(TR, "decode beyond max_position_embeddings", ["llama-3.2-1b", "--decode", "-c", "200000", "--json"], True),
        Case(TG, "decode beyond max_position_embeddings", ["llama-3.2-1b", "--device", "h200", "--decode", "-c",
                                                           "200000", "--json"], True),
    ]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds before a case counts as a hang (default 60)")
    p.add_argument("--only", default=None, help="comma-separated classes (" + "optimizer,limits,plot,combinations,"
                                                "context)")
    p.add_argument("--verbose", action="store_true", help="print every case's outcome, not only the wrong ones")
    args = p.parse_args()
    os.environ.setdefault("TRACECOST_CACHE_DIR", tempfile.mkdtemp(prefix="tracecost-odd-cache-"))
    with tempfile.TemporaryDirectory(prefix="tracecost-odd-") as tmp:
        classes = cases(Path(tmp))
        if args.only:
            classes = {k: v for k, v in classes.items() if k in args.only.split(",")}
        todo = [(name, c) for name, group in classes.items() for c in group]
        start = time.perf_counter()
        with ThreadPoolExecutor(args.jobs) as pool:
            results = list(pool.map(lambda nc: (nc[0], nc[1], *classify(nc[1], args.timeout)), todo))
        left = list(Path(tmp).iterdir())   # a plot written under another name than the one given
    counts: dict[str, int] = {}
    for name, case, outcome, detail, seconds in results:
        counts[outcome] = counts.get(outcome, 0) + 1
        if args.verbose or not outcome.startswith("ok"):
            print(f"{outcome:18s} {seconds:5.1f}s  [{name}] {case.cli.split('.')[-1]} {case.label}: {detail[:140]}")
    print(f"\n{len(results)} cases in {time.perf_counter() - start:.0f} s")
    for outcome in ("traceback", "timeout", "bad numbers", "silent acceptance", "ok (refused)", "ok (answered)"):
        print(f"  {outcome:18s} {counts.pop(outcome, 0)}")
    for outcome, n in counts.items():
        print(f"  {outcome:18s} {n}")
    stray = sorted(p.name for p in left if p.name not in ("rates.txt", "trace.jsonl"))
    print(f"  files written that no case named: {len(stray)} {stray or ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
