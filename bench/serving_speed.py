"""Wall time of simulating 10,000 multi-turn-chat requests (Llama-3.1-8B on one H100).

    python bench/serving_speed.py
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    args = ["llama-3.1-8b", "--device", "h100", "--workload", "multi-turn-chat", "--num-requests", "10000",
            "--request-rate", "20", "--json"]
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "cli.inference.serving_sim", *args], cwd=ROOT, check=True,
                   capture_output=True, env=dict(os.environ, TRACECOST_NO_CACHE="1"))
    print(f"10,000 multi-turn-chat requests: {time.perf_counter() - start:.1f} s wall (process start included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
