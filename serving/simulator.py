"""Continuous-batching server simulation with block-level prefix caching.

Each step runs the decode tokens of every running request plus prefill chunks up to the token
budget (chunked prefill). Its time comes from the tracer and cost model for that step's shape:
the non-attention work of all the step's tokens, the attention of each prefill chunk over its
context, and the decode attention. Shapes are bucketed to powers of two and interpolated, so a
long simulation traces only a few dozen distinct shapes.
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

from cost.estimate import Parallelism, estimate
from cost.profile import HardwareProfile
from tracer.model_source import ModelSpec
from tracer.trace import trace
from tracer.work import Request, TraceOptions

from .block_cache import BlockPool
from .workload import SimRequest


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


class StepCost:
    def __init__(self, spec: ModelSpec, hw: HardwareProfile, options: TraceOptions, execution: str, tp: int,
                 engine: str = "vllm"):
        self.spec, self.hw, self.options, self.execution, self.tp = spec, hw, options, execution, tp
        self.engine = engine
        self._cache: dict = {}

    def _parts(self, request: Request) -> tuple[float, float]:
        """(seconds without attention, attention seconds) of one forward."""
        if request not in self._cache:
            e = estimate(trace(self.spec, request, self.options), self.hw, self.execution, Parallelism(self.tp),
                         self.engine)
            attention = e.breakdown_s["attention"]
            self._cache[request] = (e.wall_s - attention, attention)
        return self._cache[request]

    def linear(self, tokens: int) -> float:
        """Everything but attention for a step of `tokens` tokens, interpolated between power-of-two shapes."""
        if tokens <= 0:
            return 0.0
        hi = _pow2_at_least(tokens)
        lo = max(1, hi // 2)
        t_hi = self._parts(Request(1, hi, 0))[0]
        if hi == lo or tokens == hi:
            return t_hi
        t_lo = self._parts(Request(1, lo, 0))[0]
        return t_lo + (t_hi - t_lo) * (tokens - lo) / (hi - lo)

    def prefill_attention(self, tokens: int, context: int) -> float:
        tb, cb = _pow2_at_least(tokens), (_pow2_at_least(context) if context else 0)
        return self._parts(Request(1, tb, cb))[1] * tokens / tb

    def decode_attention(self, batch: int, context: int) -> float:
        if batch == 0:
            return 0.0
        bb, cb = _pow2_at_least(batch), _pow2_at_least(max(1, context))
        return self._parts(Request(bb, 1, cb, decode=True))[1] * batch / bb

    def step(self, chunks: list[tuple[int, int]], decode_batch: int, decode_context: int) -> float:
        tokens = sum(t for t, _ in chunks) + decode_batch
        return (self.linear(tokens) + sum(self.prefill_attention(t, c) for t, c in chunks)
                + self.decode_attention(decode_batch, decode_context))


@dataclass
class _Running:
    req: SimRequest
    remaining_prefill: int
    context: int
    private_blocks: int
    generated: int = 0
    first_token_s: float | None = None


@dataclass(frozen=True)
class ServerConfig:
    block_size: int = 16
    gpu_blocks: int = 10000
    cpu_blocks: int = 0
    max_prefill_tokens: int = 8192
    max_running: int = 256
    prefix_caching: bool = True
    block_bytes: float = 0.0
    host_link_bytes_per_s: float = 64e9


@dataclass
class SimResult:
    completed: int = 0
    rejected: int = 0
    prompt_tokens: int = 0
    reused_tokens: int = 0
    prompt_blocks: int = 0
    hit_blocks: int = 0
    output_tokens: int = 0
    makespan_s: float = 0.0
    steps: int = 0
    ttft_s: list = field(default_factory=list)
    tpot_s: list = field(default_factory=list)
    gpu_blocks_peak: int = 0
    gpu_block_seconds: float = 0.0
    cpu_blocks_peak: int = 0
    cpu_block_seconds: float = 0.0
    allocated_blocks: int = 0
    evicted_blocks: int = 0
    cpu_hit_blocks: int = 0
    cpu_transfer_s: float = 0.0
    cpu_saved_compute_s: float = 0.0
    rejected_ids: list = field(default_factory=list)

    def summary(self, config: ServerConfig) -> dict:
        def pct(values, p):
            if not values:
                return None
            v = sorted(values)
            return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))] * 1e3
        gb = config.block_bytes / 1e9
        span = max(self.makespan_s, 1e-12)
        return {
            "completed_requests": self.completed, "rejected_requests": self.rejected,
            "hit_rate": self.reused_tokens / max(1, self.prompt_tokens),
            "block_hit_rate": self.hit_blocks / max(1, self.prompt_blocks),
            "reused_tokens": self.reused_tokens, "prompt_tokens": self.prompt_tokens,
            "ttft_ms": {"p50": pct(self.ttft_s, 50), "p90": pct(self.ttft_s, 90), "p99": pct(self.ttft_s, 99),
                        "mean": statistics.fmean(self.ttft_s) * 1e3 if self.ttft_s else None},
            "tpot_ms": {"p50": pct(self.tpot_s, 50), "p99": pct(self.tpot_s, 99)},
            "prefill_tokens_per_s": self.prompt_tokens / span, "output_tokens_per_s": self.output_tokens / span,
            "kv_memory_gb": {"gpu_peak": self.gpu_blocks_peak * gb, "gpu_mean": self.gpu_block_seconds / span * gb,
                             "gpu_capacity": config.gpu_blocks * gb, "cpu_peak": self.cpu_blocks_peak * gb,
                             "cpu_mean": self.cpu_block_seconds / span * gb, "cpu_capacity": config.cpu_blocks * gb},
            "eviction_rate": self.evicted_blocks / max(1, self.allocated_blocks),
            "cpu_tier": {"hit_blocks": self.cpu_hit_blocks, "transfer_ms": self.cpu_transfer_s * 1e3,
                         "saved_compute_ms": self.cpu_saved_compute_s * 1e3},
            "makespan_s": self.makespan_s, "steps": self.steps,
        }


def simulate(requests: list[SimRequest], cost: StepCost, config: ServerConfig) -> SimResult:
    bs = config.block_size
    pool = BlockPool(config.gpu_blocks, config.cpu_blocks, config.prefix_caching)
    for r in requests:
        if not r.block_hashes:
            r.hash_blocks(bs)
    res = SimResult()
    arrivals = deque(sorted(requests, key=lambda r: r.arrival_s))
    queue: deque[SimRequest] = deque()
    prefilling: list[_Running] = []
    decoding: list[_Running] = []
    now = 0.0
    while arrivals or queue or prefilling or decoding:
        while arrivals and arrivals[0].arrival_s <= now:
            queue.append(arrivals.popleft())
        if not (queue or prefilling or decoding):
            now = arrivals[0].arrival_s
            continue
        load_s = 0.0
        while queue and len(prefilling) + len(decoding) < config.max_running:
            r = queue[0]
            # without prefix caching no block has an identity: identical prompts get blocks of their own
            hashes = r.block_hashes if config.prefix_caching else []
            private = math.ceil((r.prompt_tokens + r.output_tokens) / bs) - len(hashes)
            if len(hashes) + private > config.gpu_blocks:
                queue.popleft()
                res.rejected += 1
                res.rejected_ids.append(r.rid)
                continue
            gpu_hits, cpu_found = pool.match(hashes)
            cpu_loads = 0
            if cpu_found:
                transfer = cpu_found * config.block_bytes / config.host_link_bytes_per_s
                recompute = cost.linear(cpu_found * bs) + cost.prefill_attention(cpu_found * bs, gpu_hits * bs)
                if transfer < recompute:  # load from the CPU tier only when it beats recomputing
                    cpu_loads = cpu_found
                    res.cpu_transfer_s += transfer
                    res.cpu_saved_compute_s += recompute
                    load_s += transfer
            if not pool.allocate(hashes, gpu_hits, cpu_loads, private):
                break  # wait for running requests to free blocks
            queue.popleft()
            cached = min((gpu_hits + cpu_loads) * bs, r.prompt_tokens - 1)  # the last token is always computed
            res.prompt_tokens += r.prompt_tokens
            res.reused_tokens += cached
            res.prompt_blocks += len(r.block_hashes)
            res.hit_blocks += gpu_hits + cpu_loads
            res.cpu_hit_blocks += cpu_loads
            prefilling.append(_Running(r, r.prompt_tokens - cached, cached, private))
        if not (prefilling or decoding):
            now = arrivals[0].arrival_s if arrivals else now
            if not arrivals and queue:  # nothing runs and the head never fits: cannot happen, but never hang
                r = queue.popleft()
                res.rejected += 1
                res.rejected_ids.append(r.rid)
            continue
        budget, chunks, advanced = config.max_prefill_tokens, [], []
        for s in prefilling:
            if budget == 0:
                break
            take = min(s.remaining_prefill, budget)
            chunks.append((take, s.context))
            advanced.append((s, take))
            budget -= take
        decode_ctx = int(statistics.fmean(s.context for s in decoding)) if decoding else 0
        step_s = cost.step(chunks, len(decoding), decode_ctx) + load_s
        res.gpu_block_seconds += pool.used * step_s
        res.cpu_block_seconds += len(pool.cpu) * step_s
        now += step_s
        res.steps += 1
        res.gpu_blocks_peak = max(res.gpu_blocks_peak, pool.used)
        res.cpu_blocks_peak = max(res.cpu_blocks_peak, len(pool.cpu))
        finished = []
        for s in decoding:
            s.generated += 1
            s.context += 1
            if s.generated >= s.req.output_tokens:
                finished.append(s)
        for s, take in advanced:
            s.remaining_prefill -= take
            s.context += take
            if s.remaining_prefill == 0:
                s.first_token_s = now
                s.generated = 1
                res.ttft_s.append(now - s.req.arrival_s)
                prefilling.remove(s)
                (finished if s.generated >= s.req.output_tokens else decoding).append(s)
        for s in finished:
            if s in decoding:
                decoding.remove(s)
            pool.release(s.req.block_hashes if config.prefix_caching else [], s.private_blocks)
            res.completed += 1
            res.output_tokens += s.req.output_tokens
            if s.req.output_tokens > 1:
                res.tpot_s.append((now - s.first_token_s) / (s.req.output_tokens - 1))
    res.makespan_s = now
    res.allocated_blocks, res.evicted_blocks = pool.stats.allocated_blocks, pool.stats.evicted_blocks
    return res
