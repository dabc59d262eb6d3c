"""Wall and CPU time of serving_sim runs (Llama-3.1-8B on H100, the disk trace cache off):
10,000 multi-turn-chat requests; and, given the Mooncake conversation trace, the whole trace at four GPU
cache sizes (one instance; four instances with cache-aware routing), each sweep split over two processes.

    python bench/serving_speed.py [--mooncake FAST25-release/traces/conversation_trace.jsonl]

CPU time is the processes' user + system time: on a shared machine it is the steadier number.
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cli.progress import Progress  # noqa: E402

RUNS = {
    "10,000 multi-turn-chat requests": ["--workload", "multi-turn-chat", "--num-requests", "10000",
                                        "--request-rate", "20"],
    "Mooncake conversation trace, 1 instance, 4 GPU cache sizes": [
        "--workload", "mooncake:{trace}", "--sweep-gpu-cache-gb", "8,16,32,64", "--jobs", "2"],
    "Mooncake conversation trace, 4 instances, 4 GPU cache sizes": [
        "--workload", "mooncake:{trace}", "--instances", "4", "--routing", "cache-aware",
        "--sweep-gpu-cache-gb", "8,16,32,64", "--jobs", "2"],
}


def timed(args: list[str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "cli.inference.serving_sim", "llama-3.1-8b", "--device", "h100", *args,
                    "--json"], cwd=ROOT, check=True, capture_output=True, env=dict(os.environ, TRACECOST_NO_CACHE="1"))
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mooncake", default=None, help="FAST25-release/traces/conversation_trace.jsonl")
    args = p.parse_args()
    runs = {label: [a.replace("{trace}", args.mooncake or "") for a in run] for label, run in RUNS.items()
            if args.mooncake or "{trace}" not in " ".join(run)}
    with Progress(len(runs), "runs") as bar:
        for label, run in runs.items():
            bar.describe(label[:40])
            wall, cpu = timed(run)
            bar.update()
            print(f"{label}: {wall:.1f} s wall, {cpu:.1f} s CPU (process start included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
