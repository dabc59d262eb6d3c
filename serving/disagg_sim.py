"""Disaggregated serving in the event simulator: a prefill pool and a decode pool, each with its own queue.

- Prefill instances are the simulator's engines (serving/engine.py) running each prompt with one output
  token: chunked prefill within the step budget, continuous batching, their own waiting queue, routed to the
  least loaded instance.
- The KV of a finished prompt goes to a decode instance over the prefill instance's link, one transfer at a
  time (a transfer waits for the ones before it: the link's own queue), taking KV bytes / link bandwidth.
- Decode instances admit arrived requests in order while a slot (max_num_seqs) and KV for the whole request are
  free (a decode instance reserves the prompt's KV it receives plus the output it will write, so it never
  preempts), and run decode-only steps over every admitted request, priced by StepCost.

The client's first token is the prefill's, visible once its KV has reached the decode pool (as in the
steady-state model, serving/search.py Searcher.disagg); TPOT is the rest of the output over the tokens after
the first. Every request also pays the engine's per-request time outside the steps once.
"""
from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field, replace

from .engine import Engine, Seq
from .kv_cache import make_cache
from .metrics import SimResult
from .simulator import ServerConfig
from .step_cost import StepCost
from .workload import SimRequest


@dataclass(frozen=True)
class DisaggConfig:
    prefill: ServerConfig                 # the prefill pool: instances, their budget, slots and cache
    decode_instances: int
    decode_max_running: int
    decode_kv_tokens: int                 # per decode instance
    kv_bytes_per_token: float             # the whole model's KV of one token (what one transfer moves per token)
    link_bytes_per_s: float               # one prefill instance's link to the decode pool


@dataclass(frozen=True)
class DisaggRecord:
    rid: int
    arrival_s: float
    prefill_done_s: float                 # the prompt's KV is computed (the prefill engine's clock)
    first_token_s: float                  # its KV reached the decode pool
    decode_admit_s: float
    finish_s: float
    prompt_tokens: int
    output_tokens: int
    outside_s: float

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s + self.outside_s

    @property
    def tpot_s(self) -> float | None:
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1) if self.output_tokens > 1 else None

    @property
    def transfer_wait_s(self) -> float:
        return self.first_token_s - self.prefill_done_s


@dataclass
class DisaggResult:
    records: list[DisaggRecord] = field(default_factory=list)
    rejected_ids: list[int] = field(default_factory=list)
    makespan_s: float = 0.0
    prefill_steps: int = 0
    decode_steps: int = 0
    decode_running_s: float = 0.0         # integral of the decode batch over time (for its mean)

    @property
    def output_tokens_per_s(self) -> float:
        return sum(r.output_tokens for r in self.records) / self.makespan_s if self.makespan_s > 0 else 0.0


class DecodeInstance:
    """Decode-only continuous batching over requests whose prompt KV arrived from the prefill pool."""

    def __init__(self, index: int, cost: StepCost, max_running: int, kv_tokens: int):
        self.index, self.cost, self.max_running, self.kv_tokens = index, cost, max_running, kv_tokens
        self.waiting: deque = deque()     # (request, first token time)
        self.running: list = []           # [request, tokens generated, first token time, admitted at]
        self.clock, self.kv_used = 0.0, 0

    @property
    def load(self) -> int:
        return len(self.waiting) + len(self.running)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def enqueue(self, req: SimRequest, now: float) -> None:
        if not self.has_work():
            self.clock = max(self.clock, now)
        self.waiting.append((req, now))

    def step(self, done: list) -> float:
        """One decode step; finished requests go to `done` as (request, first token, admitted, finish)."""
        while self.waiting and len(self.running) < self.max_running:
            req, first = self.waiting[0]
            need = req.prompt_tokens + req.output_tokens
            if self.kv_used + need > self.kv_tokens and self.running:
                break
            self.waiting.popleft()
            self.kv_used += need
            self.running.append([req, 1, first, self.clock])
        if not self.running:
            return 0.0
        batch = len(self.running)
        context = sum(r[0].prompt_tokens + r[1] for r in self.running) // batch
        dt = self.cost.step([], batch, context)
        self.clock += dt
        keep = []
        for r in self.running:
            r[1] += 1
            if r[1] >= r[0].output_tokens:
                done.append((r[0], r[2], r[3], self.clock))
                self.kv_used -= r[0].prompt_tokens + r[0].output_tokens
            else:
                keep.append(r)
        self.running = keep
        return dt * batch


def simulate_disagg(requests: list[SimRequest], prefill_cost: StepCost, decode_cost: StepCost,
                    config: DisaggConfig) -> DisaggResult:
    """Run both pools until every request finishes."""
    res, pcfg = DisaggResult(), config.prefill
    prefill_res = SimResult()
    transfers: list = []                  # heap of (time the KV arrives, rid)
    link_free = [0.0] * pcfg.instances
    done_at: dict[int, float] = {}
    by_id = {r.rid: r for r in requests}
    instance_of: dict[int, int] = {}

    def on_prefill_done(req: SimRequest, now: float) -> None:
        i = instance_of[req.rid]
        start = max(now, link_free[i])
        link_free[i] = start + req.prompt_tokens * config.kv_bytes_per_token / config.link_bytes_per_s
        done_at[req.rid] = now
        heapq.heappush(transfers, (link_free[i], req.rid))

    prefill = [Engine(i, make_cache(pcfg.cache_policy, pcfg.gpu_blocks, pcfg.block_size, pcfg.prefix_caching),
                      prefill_cost, pcfg, None, prefill_res, on_finish=on_prefill_done) for i in range(pcfg.instances)]
    decode = [DecodeInstance(i, decode_cost, config.decode_max_running, config.decode_kv_tokens)
              for i in range(config.decode_instances)]
    pending = deque(sorted(requests, key=lambda r: (r.arrival_s, r.rid)))
    fits = prefill[0].cache.capacity_blocks
    finished, outside = [], decode_cost.overheads.request_ms * 1e-3
    first_token: dict[int, float] = {}
    while True:
        t_arrival = pending[0].arrival_s if pending else None
        t_transfer = transfers[0][0] if transfers else None
        busy = [e for e in prefill if e.has_work()] + [e for e in decode if e.has_work()]
        engine = min(busy, key=lambda e: e.clock) if busy else None
        events = [t for t in (t_arrival, t_transfer) if t is not None]
        if not events and engine is None:
            break
        t_event = min(events) if events else None
        if t_event is not None and (engine is None or t_event <= engine.clock):
            if t_event == t_arrival:
                req = pending.popleft()
                if -(-(req.prompt_tokens + 1) // pcfg.block_size) > fits or \
                        req.prompt_tokens + req.output_tokens > config.decode_kv_tokens:
                    res.rejected_ids.append(req.rid)
                    continue
                target = min(prefill, key=lambda e: (e.load, e.index))
                instance_of[req.rid] = target.index
                # the prompt with one output token; its block identities kept, so the prefix cache hits as in a
                # mixed engine (the first prompt_tokens // block_size hashes are the prompt's)
                target.enqueue(Seq(replace(req, output_tokens=1),
                                   req.block_hashes if pcfg.prefix_caching else []), t_arrival)
            else:
                t, rid = heapq.heappop(transfers)
                first_token[rid] = t
                if by_id[rid].output_tokens > 1:
                    min(decode, key=lambda e: (e.load, e.index)).enqueue(by_id[rid], t)
            continue
        if isinstance(engine, DecodeInstance):
            before = engine.clock
            done: list = []
            res.decode_running_s += engine.step(done)
            res.decode_steps += engine.clock > before
            finished += done
        else:
            engine.step(t_event if t_event is not None else float("inf"))
            res.prefill_steps += 1
    for req, first, admitted, finish in finished:
        res.records.append(DisaggRecord(req.rid, req.arrival_s, done_at[req.rid], first, admitted, finish,
                                        req.prompt_tokens, req.output_tokens, outside))
    for rid in prefill_res.rejected_ids:
        res.rejected_ids.append(rid)
    # a one-token request is done once its prefill is: it never reaches a decode step
    for rid, t in first_token.items():
        if by_id[rid].output_tokens <= 1:
            r = by_id[rid]
            res.records.append(DisaggRecord(rid, r.arrival_s, done_at[rid], t, t, t, r.prompt_tokens, 1, outside))
    ends = [r.finish_s for r in res.records] + [e.clock for e in prefill]
    res.makespan_s = max(ends) if ends else 0.0
    return res


__all__ = ["DecodeInstance", "DisaggConfig", "DisaggRecord", "DisaggResult", "simulate_disagg"]
