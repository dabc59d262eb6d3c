"""Wall time of full throughput_optimizer searches, apart from the imports no tracecost call can avoid (issue 23).

    python bench/optimizer_speed.py [--repeat N]

Each search runs in a fresh process with the trace cache off (TRACECOST_NO_CACHE=1), against a process that only
imports torch and transformers' Llama class; the difference is the search. Cases: the README's Llama-3.1-70B search
on 8 x H100 (both modes) and DeepSeek-V3 on 8 x H200 with attention-DP and EP.
"""
from __future__ import annotations

import argparse
import os
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


def wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, env=dict(os.environ, TRACECOST_NO_CACHE="1"))
    return time.perf_counter() - start


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeat", type=int, default=1, help="runs per case; the median is reported (default 1)")
    args = p.parse_args(argv)
    base = statistics.median(wall(IMPORTS) for _ in range(args.repeat))
    print(f"bare imports: {base:.2f} s")
    for name, case in CASES.items():
        t = statistics.median(wall([sys.executable, "-m", "cli.inference.throughput_optimizer", *case])
                              for _ in range(args.repeat))
        print(f"{name}: {t:.2f} s wall, {t - base:.2f} s beyond the imports ({t / base:.1f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
