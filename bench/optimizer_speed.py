"""Wall time of a full throughput_optimizer search: Llama-3.1-70B on 8 x H100, TP 1-8, batch 1-1024, both modes.

    python bench/optimizer_speed.py
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

ARGS = ["llama-3.1-70b", "--device", "h100", "--num-devices", "8", "--input-length", "2048", "--output-length", "256",
        "--ttft-limit", "2000", "--tpot-limit", "50", "--mode", "both", "--batch-range", "1", "1024", "--json"]


def main() -> int:
    for hit_rate in ("0", "0.5"):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "cli.inference.throughput_optimizer", *ARGS, "--prefix-cache-hit-rate",
                        hit_rate], cwd=ROOT, check=True, capture_output=True,
                       env=dict(os.environ, TRACECOST_NO_CACHE="1"))
        print(f"full search, hit rate {hit_rate}: {time.perf_counter() - start:.2f} s wall (process start included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
