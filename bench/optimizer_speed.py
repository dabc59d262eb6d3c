"""Wall time of full throughput_optimizer searches, apart from the imports no tracecost call can avoid (issue 23).

    python bench/optimizer_speed.py [--repeat N]

Each search runs in a fresh process with the trace cache off (TRACECOST_NO_CACHE=1), against a process that only
imports torch and transformers' Llama class; the difference is the search. Cases: the README's Llama-3.1-70B search
on 8 x H100 (both modes) and DeepSeek-V3 on 8 x H200 with attention-DP and EP. CPU time (user + system of
the child) is printed too: on a shared machine it moves less with the other load than the wall clock does.

The difference of two processes also counts what each spends at exit: the bare-imports process ends with a full
collection of its heap, which the search's process skips for what it froze after its imports (tracer/trace.py
`prepare`). So each search is also timed inside one process, after torch, transformers and tracecost are imported
(`in-process`: CPU seconds of the search alone, its tracing included).
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMPORTS = [sys.executable, "-c", "import torch; from transformers import LlamaForCausalLM"]
CASES = {
    "llama-3.1-70b, 8 x H100, both modes": ["llama-3.1-70b", "--device", "h100", "--num-devices", "8",
                                             "--input-length", "4096", "--output-length", "512",
                                             "--prefix-cache-hit-rate", "0.5", "--ttft-limit", "2000",
                                             "--tpot-limit", "50", "--mode", "both", "--json"],
    "deepseek-v3, 8 x H200, attention-DP + EP": ["deepseek-v3", "--device", "h200", "--num-devices", "8",
                                                 "--input-length", "2048", "--output-length", "512",
                                                 "--attention-dp", "on", "--tpot-limit", "60", "--json"],
}


def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of one run in a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, env=dict(os.environ, TRACECOST_NO_CACHE="1"))
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


IN_PROCESS = """
import sys, time
import torch, transformers
from transformers import LlamaForCausalLM
import cli.inference.throughput_optimizer as optimizer
from tracer.trace import prepare
prepare()
start = time.process_time()
optimizer.main(sys.argv[1:])
print(time.process_time() - start, file=sys.stderr)
"""


def in_process(case: list[str]) -> float:
    """CPU seconds of the search inside a process that has imported everything it uses."""
    run = subprocess.run([sys.executable, "-c", IN_PROCESS, *case], cwd=ROOT, check=True, capture_output=True,
                         text=True, env=dict(os.environ, TRACECOST_NO_CACHE="1"))
    return float(run.stderr.strip().splitlines()[-1])


def median_of(cmd: list[str], repeat: int) -> tuple[float, float]:
    runs = [timed(cmd) for _ in range(repeat)]
    return statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeat", type=int, default=1, help="runs per case; the median is reported (default 1)")
    args = p.parse_args(argv)
    base, base_cpu = median_of(IMPORTS, args.repeat)
    print(f"bare imports: {base:.2f} s wall, {base_cpu:.2f} s CPU")
    for name, case in CASES.items():
        t, cpu = median_of([sys.executable, "-m", "cli.inference.throughput_optimizer", *case], args.repeat)
        inside = statistics.median(in_process(case) for _ in range(args.repeat))
        print(f"{name}: {t:.2f} s wall, {t - base:.2f} s beyond the imports ({t / base:.1f}x); "
              f"CPU {cpu - base_cpu:.2f} s beyond them; in-process {inside:.2f} s of CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
