"""Re-run an optimizer candidate in the event simulator: the same layout, engine limits, KV capacity and
load, with fixed-length requests whose first `cached` tokens are one shared prefix (so the prefix cache hits
them as the RFC's hit rate says). The steady-state model and the simulator then answer the same question.
"""
from __future__ import annotations

import math
import random
from dataclasses import replace

from tracer.trace import trace
from tracer.work import Request

from . import overload
from .arrivals import ClosedLoopArrivals
from .capacity import reserves_whole_output
from .disagg_sim import DisaggConfig, simulate_disagg
from .layouts import Layout
from .lengths import LengthDistribution
from .metrics import latency_ms
from .search import Candidate, Searcher
from .simulator import ServerConfig, simulate
from .slo import LatencyLimits, goodput_of
from .steady_state import CONCURRENCY, MAX, RATE, Load
from .workload import SimRequest, arrival_times

BLOCK = 16


def fixed_requests(n: int, input_tokens: int, output_tokens: int, cached_tokens: int, arrivals: list[float],
                   lengths: LengthDistribution | None = None, seed: int = 0) -> list[SimRequest]:
    """`n` requests arriving at `arrivals`; with `lengths`, the expected sample of n (the requests the model's walk of
    a burst prices), in an order the seed shuffles."""
    sizes = lengths.stratified(n, seed) if lengths is not None else [(input_tokens, output_tokens)] * n
    out = []
    for i, (prompt, output) in enumerate(sizes):
        cached = min(cached_tokens, prompt - 1)
        segs = [("shared-prefix", cached)] if cached else []
        segs.append((f"prompt-{i}", prompt - cached))
        out.append(SimRequest(i, arrivals[i], prompt, output, segments=segs, session=f"user-{i}"))
    return out


def tail_requests(stat: str) -> int:
    """Requests a run needs for its percentile `stat` (p90, p99; mean: none) to rest on ~50 beyond it, in the
    60% of an open-ended run that is measured."""
    if not stat.startswith("p"):
        return 0
    return math.ceil(50 / (1 - float(stat[1:]) / 100) / 0.6)


def simulate_candidate(searcher: Searcher, candidate: Candidate, load: Load, requests: int | None = None,
                       seed: int = 0) -> dict:
    """The simulator's TTFT, TPOT and throughput for a mixed candidate at `load` (for max-throughput searches,
    the candidate's own request rate)."""
    layout: Layout = candidate.layout
    limits, mem = searcher.engine_limits(layout)
    engines = layout.dp * layout.pp        # pipeline micro-batch streams simulate as engines of their own
    w = searcher.w
    if load.kind == MAX and not load.requests:
        load = Load("rate", candidate.request_rate, load.arrival)
    per_engine_running = max(1.0, candidate.running / max(1, layout.pp))
    # a finite run (every request at once, or N requests by C users): all of it counts
    burst = load.kind in (MAX, CONCURRENCY) and load.requests > 0
    if burst:
        n = load.requests
    else:
        # near saturation the batch takes many residences to fill from empty: a long run, its first 30% dropped;
        # a percentile limit needs ~50 requests beyond it in the 60% of the run that is measured (p99: 8,333)
        n = requests or max(tail_requests(searcher.limits.stat),
                            int(min(20000, max(400, 60 * engines * per_engine_running))))
    if load.kind == CONCURRENCY or burst:
        times = [0.0] * n
    else:
        times = arrival_times(n, load.value, random.Random(seed), load.arrival)
    reqs = fixed_requests(n, w.input_tokens, w.output_tokens, w.cached_tokens, times, w.lengths, seed)
    config = ServerConfig(block_size=BLOCK, gpu_blocks=max(2, limits.kv_tokens // BLOCK + 1),
                          max_prefill_tokens=limits.max_batched_tokens, max_running=limits.max_num_seqs,
                          prefix_caching=w.cached_tokens > 0, instances=engines,
                          gpus_per_instance=layout.gpus // engines, cache_policy="vllm",
                          reserve_output=reserves_whole_output(searcher.settings.engine,
                                                               searcher.settings.capacity_scheduler),
                          chat_requests=searcher.settings.chat_requests)
    for r in reqs:
        r.hash_blocks(BLOCK)
    arrivals = ClosedLoopArrivals(reqs, int(load.value)) if load.kind == CONCURRENCY else None
    result = simulate(reqs, searcher.cost(layout), config, arrivals)
    summary = result.summary(config)
    # the first and last stretches of an open-ended run are not the steady state: the batch fills from empty,
    # then drains; latencies of the requests from 30% to 90% of the run (a finite burst: every request)
    recs = sorted(result.records, key=lambda r: r.arrival_s)
    middle = recs if burst else recs[3 * len(recs) // 10: len(recs) - len(recs) // 10] or recs
    tpots = [r.tpot_s for r in middle if r.tpot_s is not None]
    out = {"requests": n, "ttft_ms": latency_ms([r.ttft_s for r in middle]),
           "tpot_ms": latency_ms(tpots)["mean"] if tpots else 0.0,
           "tpot_q_ms": latency_ms(tpots) if tpots else {},
           "output_tokens_per_s": summary["output_tokens_per_s"], "hit_rate": summary["hit_rate"],
           "preemptions": summary["preemptions"]["count"],
           "overload": [] if burst else overload.simulated(
               result.records, reqs, int(load.value) if load.kind == CONCURRENCY else None,
               limits.max_num_seqs * engines if load.kind == CONCURRENCY else None,
               f" (simulated {candidate.label})")}
    return {**out, **judged(out, middle, searcher.limits)}


def simulate_disagg_candidate(searcher: Searcher, candidate: Candidate, load: Load, requests: int | None = None,
                              seed: int = 0) -> dict:
    """The disaggregated simulator (serving/disagg_sim.py) at a disaggregated candidate's pools and load (for
    max-throughput searches and closed loops, the candidate's own request rate, open loop)."""
    pre, dec = candidate.prefill, candidate.layout
    pre_one, dec_one = replace(pre, dp=1), replace(dec, dp=1)
    limits_p, _ = searcher.engine_limits(pre_one)
    limits_d, _ = searcher.engine_limits(dec_one)
    w = searcher.w
    rate = load.value if load.kind == RATE else candidate.request_rate
    n = requests or max(tail_requests(searcher.limits.stat),
                        int(min(8000, max(400, 60 * candidate.decode_instances * max(1.0, candidate.running)))))
    times = arrival_times(n, rate, random.Random(seed), load.arrival if load.kind == RATE else "poisson")
    reqs = fixed_requests(n, w.input_tokens, w.output_tokens, w.cached_tokens, times, w.lengths, seed)
    kv_per_token = trace(searcher.spec, Request(1, 1, 1, decode=True), searcher.options).kv_bytes_per_token
    config = DisaggConfig(
        ServerConfig(block_size=BLOCK, gpu_blocks=max(2, limits_p.kv_tokens // BLOCK + 1),
                     max_prefill_tokens=limits_p.max_batched_tokens, max_running=limits_p.max_num_seqs,
                     prefix_caching=w.cached_tokens > 0, instances=candidate.prefill_instances,
                     gpus_per_instance=pre_one.gpus, cache_policy="vllm",
                     chat_requests=searcher.settings.chat_requests),
        candidate.decode_instances, limits_d.max_num_seqs, limits_d.kv_tokens, kv_per_token,
        searcher.hw.interconnect_bandwidth_gbps * 1e9)
    for r in reqs:
        r.hash_blocks(BLOCK)
    result = simulate_disagg(reqs, searcher.cost(pre_one), searcher.cost(dec_one), config)
    recs = sorted(result.records, key=lambda r: r.arrival_s)
    middle = recs[3 * len(recs) // 10: len(recs) - len(recs) // 10] or recs
    tpots = [r.tpot_s for r in middle if r.tpot_s is not None]
    out = {"requests": n, "ttft_ms": latency_ms([r.ttft_s for r in middle]),
           "tpot_ms": latency_ms(tpots)["mean"] if tpots else 0.0,
           "tpot_q_ms": latency_ms(tpots) if tpots else {},
           "output_tokens_per_s": result.output_tokens_per_s,
           "transfer_wait_ms": latency_ms([r.transfer_wait_s for r in middle]),
           "decode_wait_ms": latency_ms([r.decode_admit_s - r.first_token_s for r in middle]),
           "rejected": len(result.rejected_ids),
           "overload": overload.simulated([_Admitted(r) for r in result.records], reqs,
                                          where=f" (simulated {candidate.label})")}
    return {**out, **judged(out, middle, searcher.limits)}


class _Admitted:
    """A disaggregated request as the overload checks read it: admitted when its prefill instance took it."""
    __slots__ = ("arrival_s", "admit_s", "finish_s")

    def __init__(self, r):
        # the wait before the first token beyond the prefill itself: the prefill queue and the link's
        self.arrival_s, self.admit_s, self.finish_s = r.arrival_s, r.first_token_s, r.finish_s


def judged(sim: dict, records: list, limits: LatencyLimits) -> dict:
    """The simulation against the limits: whether it meets them at their statistic, and its goodput (the share
    of `records` within every limit, times the requests/s it served)."""
    why = limits.why_not(sim["ttft_ms"], sim["tpot_ms"], sim["tpot_q_ms"] or None) + sim.get("overload", [])
    if sim["ttft_ms"]["mean"] is None:
        why = ["no request finished in the simulation"]
    mean_output = sum(r.output_tokens for r in records) / len(records) if records else 0
    served = sim["output_tokens_per_s"] / mean_output if mean_output else 0.0
    good = goodput_of([r.ttft_s * 1e3 for r in records],
                      [r.tpot_s * 1e3 if r.tpot_s is not None else None for r in records], 1.0, limits)
    return {"meets_limits": not why, "why_not": why,
            "goodput_requests_per_s": served * good / len(records) if records else 0.0}




def simulated_best_rate(searcher: Searcher, layout: Layout, guess: float, steps: int = 6, seed: int = 0) \
        -> tuple[float, dict]:
    """The highest request rate whose simulated latencies meet the searcher's limits (at its statistic), by
    bisection from `guess` (the steady state's answer) over [guess / 2, guess * 1.5]: (rate, simulation)."""
    limits = searcher.limits

    def meets(sim: dict) -> bool:
        ttft = sim["ttft_ms"][limits.stat]
        return not limits.why_not(sim["ttft_ms"], sim["tpot_ms"], sim["tpot_q_ms"] or None) and ttft is not None

    lo, hi, best = guess / 2, guess * 1.5, None
    for _ in range(steps):
        mid = (lo + hi) / 2
        sim = simulate_candidate(searcher, searcher.mixed(layout, Load("rate", mid)), Load("rate", mid), seed=seed)
        if meets(sim):
            lo, best = mid, sim
        else:
            hi = mid
    return lo, best


__all__ = ["fixed_requests", "judged", "simulate_disagg_candidate", "simulate_candidate", "simulated_best_rate"]
