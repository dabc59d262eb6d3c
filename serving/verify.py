"""Re-run an optimizer candidate in the event simulator: the same layout, engine limits, KV capacity and
load, with fixed-length requests whose first `cached` tokens are one shared prefix (so the prefix cache hits
them as the RFC's hit rate says). The steady-state model and the simulator then answer the same question.
"""
from __future__ import annotations

import random

from .arrivals import ClosedLoopArrivals
from .layouts import Layout
from .metrics import latency_ms
from .search import Candidate, Searcher
from .simulator import ServerConfig, simulate
from .steady_state import CONCURRENCY, MAX, Load
from .workload import SimRequest, arrival_times

BLOCK = 16


def fixed_requests(n: int, input_tokens: int, output_tokens: int, cached_tokens: int, arrivals: list[float]) \
        -> list[SimRequest]:
    out = []
    for i in range(n):
        segs = [("shared-prefix", cached_tokens)] if cached_tokens else []
        segs.append((f"prompt-{i}", input_tokens - cached_tokens))
        out.append(SimRequest(i, arrivals[i], input_tokens, output_tokens, segments=segs, session=f"user-{i}"))
    return out


def simulate_candidate(searcher: Searcher, candidate: Candidate, load: Load, requests: int | None = None,
                       seed: int = 0) -> dict:
    """The simulator's TTFT, TPOT and throughput for a mixed candidate at `load` (for max-throughput searches,
    the candidate's own request rate)."""
    layout: Layout = candidate.layout
    limits, mem = searcher.engine_limits(layout)
    engines = layout.dp * layout.pp        # pipeline micro-batch streams simulate as engines of their own
    w = searcher.w
    if load.kind == MAX:
        load = Load("rate", candidate.request_rate, load.arrival)
    per_engine_running = max(1.0, candidate.running / max(1, layout.pp))
    n = requests or int(min(4000, max(400, 30 * engines * per_engine_running)))
    if load.kind == CONCURRENCY:
        times = [0.0] * n
    else:
        times = arrival_times(n, load.value, random.Random(seed), load.arrival)
    reqs = fixed_requests(n, w.input_tokens, w.output_tokens, w.cached_tokens, times)
    config = ServerConfig(block_size=BLOCK, gpu_blocks=max(2, limits.kv_tokens // BLOCK + 1),
                          max_prefill_tokens=limits.max_batched_tokens, max_running=limits.max_num_seqs,
                          prefix_caching=w.cached_tokens > 0, instances=engines,
                          gpus_per_instance=layout.gpus // engines, cache_policy="vllm")
    for r in reqs:
        r.hash_blocks(BLOCK)
    arrivals = ClosedLoopArrivals(reqs, int(load.value)) if load.kind == CONCURRENCY else None
    result = simulate(reqs, searcher.cost(layout), config, arrivals)
    summary = result.summary(config)
    # the first and last stretches of a finite run are not the steady state: latencies of the middle 80%
    recs = sorted(result.records, key=lambda r: r.arrival_s)
    middle = recs[len(recs) // 10: len(recs) - len(recs) // 10] or recs
    tpots = [r.tpot_s for r in middle if r.tpot_s is not None]
    return {"requests": n, "ttft_ms": latency_ms([r.ttft_s for r in middle]),
            "tpot_ms": latency_ms(tpots)["mean"] if tpots else 0.0,
            "output_tokens_per_s": summary["output_tokens_per_s"], "hit_rate": summary["hit_rate"],
            "preemptions": summary["preemptions"]["count"]}


__all__ = ["fixed_requests", "simulate_candidate"]
