"""What a run measured, and the operator's view of it (seed 001): hit rates overall, per session, per tier
and over time; TTFT for hits and misses; computed prefill throughput; GPU KV held vs evictable;
evictions and re-needed blocks; preemptions; the CPU pool's loads, stores and drops."""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import numpy as np


@dataclass(slots=True)   # not frozen: one per request is built in the event loop, and frozen fields cost 10x
class RequestRecord:
    rid: int
    arrival_s: float
    admit_s: float
    ttft_s: float
    tpot_s: float | None
    prompt_tokens: int
    output_tokens: int
    gpu_hit_tokens: int       # at first admission; preempted re-admissions are counted apart, as vLLM does
    cpu_hit_tokens: int
    session: str
    instance: int
    preemptions: int
    finish_s: float = 0.0

    @property
    def e2e_s(self) -> float:
        return self.finish_s - self.arrival_s

    @property
    def hit(self) -> bool:
        return self.gpu_hit_tokens + self.cpu_hit_tokens > 0


@dataclass
class SimResult:
    records: list = field(default_factory=list)
    rejected_ids: list = field(default_factory=list)
    makespan_s: float = 0.0
    steps: int = 0
    computed_prefill_tokens: int = 0
    preemptions: int = 0
    recomputed_tokens: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0
    gpu_used_block_s: float = 0.0
    gpu_evictable_block_s: float = 0.0
    gpu_used_peak: float = 0.0
    gpu_evictable_peak: float = 0.0
    evicted_blocks: float = 0.0
    allocated_blocks: float = 0.0
    renneeded_blocks: int = 0
    cpu_hit_blocks: int = 0
    cpu_load_s: float = 0.0
    cpu_saved_compute_s: float = 0.0
    cpu_store_s: float = 0.0
    cpu_stored_blocks: int = 0
    cpu_dropped_blocks: int = 0
    store_backlog_s: float = 0.0
    cpu_block_s: float = 0.0
    cpu_blocks_peak: int = 0
    instance_requests: list = field(default_factory=list)
    itl: list = field(default_factory=list)   # (seconds between tokens, tokens that waited that long)
    speculative_steps: int = 0    # decode steps of requests that verified proposals (one per request per step)
    speculative_tokens: int = 0   # the tokens those steps gained

    # -- the raw totals the tests read ----------------------------------------------------------------
    @property
    def completed(self) -> int:
        return len(self.records)

    @property
    def rejected(self) -> int:
        return len(self.rejected_ids)

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.records)

    @property
    def reused_tokens(self) -> int:
        return sum(r.gpu_hit_tokens + r.cpu_hit_tokens for r in self.records)

    @property
    def ttft_s(self) -> list[float]:
        return [r.ttft_s for r in self.records]

    def summary(self, config, window_s: float | None = None) -> dict:
        recs = self.records
        gb = config.block_bytes / 1e9
        span = max(self.makespan_s, 1e-12)
        prompt = sum(r.prompt_tokens for r in recs)
        gpu_hits = sum(r.gpu_hit_tokens for r in recs)
        cpu_hits = sum(r.cpu_hit_tokens for r in recs)
        capacity = config.gpu_blocks - 1 if config.cache_policy == "vllm" or not config.prefix_caching \
            else config.gpu_blocks
        n_inst = config.instances
        return {
            "completed_requests": len(recs), "rejected_requests": len(self.rejected_ids),
            "hit_rate": (gpu_hits + cpu_hits) / max(1, prompt),
            "hit_rate_by_tier": {"gpu": gpu_hits / max(1, prompt), "cpu": cpu_hits / max(1, prompt)},
            "reused_tokens": gpu_hits + cpu_hits, "prompt_tokens": prompt,
            "session_hit_rate": _sessions(recs),
            "ttft_ms": latency_ms([r.ttft_s for r in recs]),
            "ttft_ms_hit": latency_ms([r.ttft_s for r in recs if r.hit]),
            "ttft_ms_miss": latency_ms([r.ttft_s for r in recs if not r.hit]),
            "tpot_ms": latency_ms([r.tpot_s for r in recs if r.tpot_s is not None]),
            "itl_ms": _weighted_pcts(self.itl),
            "tokens_per_step": self.speculative_tokens / self.speculative_steps if self.speculative_steps else None,
            "e2e_ms": latency_ms([r.e2e_s for r in recs]),
            "computed_prefill_tokens_per_s": self.computed_prefill_tokens / span,
            "prompt_tokens_per_s": prompt / span,
            "output_tokens_per_s": sum(r.output_tokens for r in recs) / span,
            "total_tokens_per_s": sum(r.output_tokens + r.prompt_tokens for r in recs) / span,
            "output_tokens_per_s_per_gpu": sum(r.output_tokens for r in recs) / span / max(1, config.gpus),
            "total_tokens_per_s_per_gpu": sum(r.output_tokens + r.prompt_tokens for r in recs) / span
            / max(1, config.gpus),
            "request_rate": len(recs) / span,
            # GPU figures are per instance: means averaged over the instances, peaks the largest of any
            "kv_memory_gb": {
                "gpu_capacity": capacity * gb,
                "gpu_used_mean": self.gpu_used_block_s / span / n_inst * gb, "gpu_used_peak": self.gpu_used_peak * gb,
                "gpu_evictable_mean": self.gpu_evictable_block_s / span / n_inst * gb,
                "gpu_evictable_peak": self.gpu_evictable_peak * gb,
                "cpu_capacity": config.cpu_blocks * gb, "cpu_mean": self.cpu_block_s / span * gb,
                "cpu_peak": self.cpu_blocks_peak * gb},
            # vLLM's usage figure: held blocks over all blocks, cached-but-evictable ones counted as free
            "gpu_kv_usage_mean": self.gpu_used_block_s / span / max(1, capacity * n_inst),
            "evictions": {"blocks": round(self.evicted_blocks), "re_needed_blocks": self.renneeded_blocks,
                          "per_allocated_block": self.evicted_blocks / max(1e-12, self.allocated_blocks)},
            "preemptions": {"count": self.preemptions, "recomputed_tokens": self.recomputed_tokens,
                            "resumed_hit_tokens": self.preempted_hits},
            "cpu_tier": {"hit_blocks": self.cpu_hit_blocks, "load_ms": self.cpu_load_s * 1e3,
                         "saved_compute_ms": self.cpu_saved_compute_s * 1e3,
                         "stored_blocks": self.cpu_stored_blocks, "store_ms": self.cpu_store_s * 1e3,
                         "store_link_busy": self.cpu_store_s / (span * n_inst),
                         "store_backlog_peak_ms": self.store_backlog_s * 1e3,
                         "dropped_blocks": self.cpu_dropped_blocks},
            "hit_rate_over_time": _windows(recs, window_s),
            "instances": [{"requests": n, **_hit(recs, i)} for i, n in enumerate(self.instance_requests)],
            "makespan_s": self.makespan_s, "steps": self.steps,
        }


def percentile(values: list, p: float) -> float | None:
    """The p-th percentile by nearest rank (None for no values): the one rule every report here uses."""
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def latency_ms(seconds: list) -> dict:
    """Mean and p50/p90/p99 of latencies given in seconds, in ms (sorted once: percentile's rule on each)."""
    ms = [x * 1e3 for x in seconds]
    v = sorted(ms)
    at = {p: v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))] if v else None for p in (50, 90, 99)}
    return {"requests": len(ms), "p50": at[50], "p90": at[90], "p99": at[99],
            "mean": statistics.fmean(ms) if ms else None}


def _weighted_pcts(samples: list) -> dict:
    """Percentiles of values given as (value, how many times) pairs, in ms: the first value (in (value, count)
    order) at which the running count reaches each mark."""
    if not samples:
        return {"tokens": 0, "p50": None, "p90": None, "p99": None, "mean": None}
    pairs = np.array(samples, dtype=np.float64)
    order = np.lexsort((pairs[:, 1], pairs[:, 0]))
    values, counts = pairs[order, 0].tolist(), [int(n) for n in pairs[order, 1].tolist()]
    reached = np.cumsum(counts)
    total = int(reached[-1])
    out = {q: values[int(np.searchsorted(reached, total * share))] * 1e3 for q, share in ((50, 0.5), (90, 0.9),
                                                                                        (99, 0.99))}
    mean = sum(v * n for v, n in zip(values, counts)) / total * 1e3
    return {"tokens": total, "p50": out[50], "p90": out[90], "p99": out[99], "mean": mean}


def _hit(recs, instance: int) -> dict:
    mine = [r for r in recs if r.instance == instance]
    return {"hit_rate": sum(r.gpu_hit_tokens + r.cpu_hit_tokens for r in mine) / max(1, sum(r.prompt_tokens
                                                                                           for r in mine))}


def _sessions(recs) -> dict:
    """Token hit rate of each session (a user or conversation; a request of its own when unknown)."""
    per: dict[str, list[int]] = {}
    for r in recs:
        acc = per.setdefault(r.session, [0, 0])
        acc[0] += r.gpu_hit_tokens + r.cpu_hit_tokens
        acc[1] += r.prompt_tokens
    rates = [h / t for h, t in per.values()]
    return {"sessions": len(rates), "mean": statistics.fmean(rates) if rates else None,
            "p10": percentile(rates, 10), "p50": percentile(rates, 50), "p90": percentile(rates, 90)}


def _windows(recs, window_s: float | None) -> dict:
    """Hit rate and TTFT of the requests admitted in each window of time: the warm-up, then the steady state."""
    if not recs:
        return {"window_s": window_s, "points": []}
    end = max(r.admit_s for r in recs)
    window_s = window_s or max(end / 40, 1e-3)
    bins: dict[int, list] = {}
    for r in recs:
        bins.setdefault(int(r.admit_s // window_s), []).append(r)
    points = []
    for k in sorted(bins):
        rs = bins[k]
        points.append({"t_s": (k + 1) * window_s, "requests": len(rs),
                       "hit_rate": sum(r.gpu_hit_tokens + r.cpu_hit_tokens for r in rs)
                       / max(1, sum(r.prompt_tokens for r in rs)),
                       "ttft_p50_ms": percentile([r.ttft_s * 1e3 for r in rs], 50)})
    return {"window_s": window_s, "points": points}
