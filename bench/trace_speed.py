"""Tracing speed and memory: the issue's two reference traces, every bundled model, and whole CLI calls.

    python bench/trace_speed.py

Reports, after imports: first trace (model build included) and a repeated, uncached trace for
DeepSeek-V3 decode (B=64, C=8192) and Llama-3.1-405B prefill (Q=4096); peak RSS over tracing every
bundled model; and wall time of a whole `python -m tracer` call in a fresh process.
"""
from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    t0 = time.perf_counter()
    from tracer import Request, bundled_models, trace
    os.environ["TRACECOST_NO_CACHE"] = "1"  # measure tracing, not the disk cache
    from tracer.trace import _TRACE_CACHE, prepare
    prepare()
    print(f"imports: {time.perf_counter() - t0:.2f} s")
    cases = [("deepseek-v3", Request(64, 1, 8192, decode=True)), ("llama-3.1-405b", Request(1, 4096, 0))]
    for model, req in cases:
        first = trace(model, req).trace_seconds
        _TRACE_CACHE.clear()
        again = trace(model, req).trace_seconds
        print(f"{model:16s} B={req.num_queries} Q={req.query_length} C={req.context_length}: first trace "
              f"{first:.2f} s (model build included), repeated shape {again:.2f} s")
    for name in bundled_models():
        trace(name, Request(8, 512, 512))
        trace(name, Request(8, 1, 4096, decode=True))
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS after tracing all {len(bundled_models())} bundled models (prefill and decode): {rss_mb:.0f} MB")
    cold = dict(os.environ, TRACECOST_NO_CACHE="1")
    for args in (["deepseek-v3", "--decode", "-b", "64", "-c", "8192", "--json"],
                 ["llama-3.1-405b", "-q", "4096", "--json"]):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "tracer", *args], cwd=ROOT, check=True, capture_output=True, env=cold)
        print(f"whole CLI call python -m tracer {' '.join(args[:4])} (no disk cache): "
              f"{time.perf_counter() - start:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
