"""A serving engine in steady state under a load, in closed form: what the optimizer searches with.

The engine runs continuous-batching steps back to back (serving/engine.py simulates them one by one). In a
steady state with `n` requests decoding and `p` prompt tokens prefilled per step, a step takes s(n, p), and
Little's law ties them to the load: requests arrive at rate R, each spends O - 1 decode steps, and brings
I' prompt tokens to prefill (I' = I minus its prefix-cache hits):

    n = R (O - 1) s          p = R I' s          s = step(n, p)           (solved as a fixed point)

Prefill is a queue served at c = budget - n tokens per step (the chunked-prefill budget left by decodes);
a request waits for the step under way, for the prompts ahead of it (M/D/1 for Poisson arrivals, none
for evenly spaced ones), then for its own ceil(I' / c) steps:

    TTFT = overhead + s / 2 + Wq + ceil(I' / c) s(n, min(I', c))      TPOT = ITL = s      E2E = TTFT + (O-1) s

Load is open loop (rate R), closed loop (C users, each sending again when answered: R = C / E2E), or
maximum throughput (every request queued at once: as many running as the engine admits). The engine
admits at most max_num_seqs requests and as many as its KV cache holds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

RATE, CONCURRENCY, MAX = "rate", "concurrency", "max"


@dataclass(frozen=True)
class Load:
    kind: str                    # rate | concurrency | max
    value: float = 0.0           # requests/s, or users
    arrival: str = "poisson"     # open loop: poisson or constant
    requests: int = 0            # max throughput: how many are queued at once (0: a long run)

    def __post_init__(self):
        if self.kind not in (RATE, CONCURRENCY, MAX):
            raise ValueError(f"unknown load '{self.kind}'")
        if self.kind != MAX and not (self.value > 0 and math.isfinite(self.value)):
            raise ValueError(f"a {self.kind} load needs a finite value > 0")


@dataclass(frozen=True)
class Limits:
    max_num_seqs: int
    max_batched_tokens: int
    kv_tokens: int               # KV-cache capacity of one replica, in tokens
    chunked_prefill: bool = True


@dataclass
class SteadyState:
    stable: bool
    request_rate: float          # requests/s one replica completes
    running: float               # requests decoding, on average
    step_s: float
    ttft_s: dict = field(default_factory=dict)   # mean, p50, p90, p99
    tpot_s: float = 0.0
    e2e_s: dict = field(default_factory=dict)
    output_tokens_per_s: float = 0.0
    total_tokens_per_s: float = 0.0
    limited_by: str = "load"     # load | max_num_seqs | kv_cache | prefill budget
    note: str = ""


def _waiting_quantiles(mean: float, busy: float) -> dict:
    """Quantiles of an M/D/1-like wait: zero with probability 1 - busy, else about exponential."""
    out = {"mean": mean}
    for q in (50, 90, 99):
        tail = 1 - q / 100
        out[f"p{q}"] = 0.0 if busy <= tail or mean <= 0 else mean / busy * math.log(busy / tail)
    return out


def solve(step, input_tokens: int, output_tokens: int, cached_tokens: int, load: Load, limits: Limits,
          request_overhead_s: float = 0.0) -> SteadyState:
    """`step(decoding, prefill_tokens, prefill_context, decode_context)`: seconds of one engine step."""
    prompt = max(1, input_tokens - cached_tokens)
    o = max(1, output_tokens)
    ctx_decode = input_tokens + o // 2
    ctx_prefill = cached_tokens + prompt // 2
    kv_per_request = input_tokens + o
    admit = max(1, min(limits.max_num_seqs, limits.kv_tokens // kv_per_request))
    budget = limits.max_batched_tokens

    def state(rate: float) -> tuple[float, float, float]:
        """(running, prefill tokens per step, step seconds) at `rate`, by fixed-point iteration."""
        s = step(0, min(prompt, budget), ctx_prefill, ctx_decode)
        for _ in range(60):
            # past the admission and budget limits the load is infeasible anyway: never price absurd shapes
            n = min(rate * (o - 1) * s, 2.0 * admit + 2)
            p = min(rate * prompt * s, 2.0 * budget)
            s_new = step(n, p, ctx_prefill, ctx_decode)
            if abs(s_new - s) <= 1e-6 * s:
                break
            s = 0.5 * (s + s_new)
        return min(rate * (o - 1) * s, 2.0 * admit + 2), min(rate * prompt * s, 2.0 * budget), s

    def ttft(n: float, p: float, s: float, poisson: bool) -> dict:
        capacity = max(1.0, budget - n)
        if not limits.chunked_prefill:
            capacity = max(capacity, prompt)       # a whole prompt goes in one step, budget or not
        own_steps = math.ceil(prompt / capacity)
        own = own_steps * step(n, min(prompt, capacity), ctx_prefill, ctx_decode)
        busy = min(0.999, p / capacity)
        service = prompt / capacity * s
        wait = busy * service / (2 * (1 - busy)) if poisson else 0.0
        w = _waiting_quantiles(wait, busy if poisson else 0.0)
        base = request_overhead_s + s / 2 + own
        return {k: base + v for k, v in w.items()}

    def feasible(rate: float) -> tuple[bool, str, tuple]:
        n, p, s = state(rate)
        if n + 1 > admit:
            return False, ("max_num_seqs" if admit == limits.max_num_seqs else "kv_cache"), (n, p, s)
        if n + p > budget * 0.98:
            return False, "prefill budget", (n, p, s)
        return True, "load", (n, p, s)

    def saturation() -> float:
        """The largest rate the replica sustains."""
        lo, hi = 0.0, 1.0
        while feasible(hi)[0] and hi < 1e7:
            lo, hi = hi, hi * 2
        for _ in range(40):
            mid = (lo + hi) / 2
            if feasible(mid)[0]:
                lo = mid
            else:
                hi = mid
        return lo

    def result(rate: float, stable: bool, limited: str, ttft_extra: float = 0.0, note: str = "") -> SteadyState:
        n, p, s = state(rate)
        t = ttft(n, p, s, load.arrival == "poisson" and load.kind == RATE)
        t = {k: v + ttft_extra for k, v in t.items()}
        e2e = {k: v + (o - 1) * s for k, v in t.items()}
        return SteadyState(stable, rate, n, s, t, s, e2e, rate * o, rate * (input_tokens + o), limited, note)

    if load.kind == RATE:
        ok, limited, _ = feasible(load.value)
        if ok:
            return result(load.value, True, "load")
        top = saturation()
        return result(top, False, limited, note=f"offered {load.value:g} requests/s exceeds the {top:.3g} "
                                                 f"this replica sustains ({limited}): queues grow without bound")
    if load.kind == CONCURRENCY:
        users = load.value
        rate = 0.0
        for _ in range(80):   # R = C / (E2E at R), damped
            r = result(rate, True, "load") if rate > 0 else None
            e2e = r.e2e_s["mean"] if r else (request_overhead_s + step(0, prompt, ctx_prefill, ctx_decode)
                                             + (o - 1) * step(1, 0, ctx_prefill, ctx_decode))
            new = users / e2e
            if rate and abs(new - rate) <= 1e-6 * rate:
                break
            rate = 0.5 * (rate + new) if rate else new
        ok, limited, _ = feasible(rate)
        if ok:
            return result(rate, True, "load")
        top = saturation()
        queued = max(0.0, users - admit) / top      # users beyond what the engine admits wait their turn
        return result(top, True, limited, ttft_extra=queued)
    # maximum throughput: as many running as the engine admits, the rest queued
    top = saturation()
    _, limited, _ = feasible(top * 1.01)
    steady = result(top, True, limited)
    if not load.requests:
        return steady
    # a finite burst queued at once: its first tokens come as fast as prefill drains the queue, which
    # is not the steady state's pace (decodes have not filled the batch yet): walk the burst step by step
    first, tpot, makespan = _burst(step, load.requests, prompt, o, admit, budget, limits.chunked_prefill,
                                   ctx_prefill, ctx_decode)
    ttft = sorted(request_overhead_s + t for t in first)
    q = {"mean": sum(ttft) / len(ttft), **{f"p{k}": ttft[min(len(ttft) - 1, round(k / 100 * (len(ttft) - 1)))]
                                           for k in (50, 90, 99)}}
    rate = load.requests / makespan
    return SteadyState(True, rate, steady.running, steady.step_s, q, tpot,
                       {k: v + (o - 1) * tpot for k, v in q.items()}, rate * o,
                       rate * (input_tokens + o), limited, f"{load.requests} requests queued at once")


def _burst(step, requests: int, prompt: int, output: int, admit: int, budget: int, chunked: bool,
           ctx_prefill: int, ctx_decode: int) -> tuple[list[float], float, float]:
    """Steps of an engine given `requests` identical requests at once: (first-token times, mean TPOT, makespan).
    Requests are admitted in order up to `admit` running; each step fills the token budget with the running
    requests' decodes, then prefill of the admitted prompts in order."""
    from collections import deque
    t, first = 0.0, []
    started, left = 0, 0            # requests admitted; prompt tokens of the one being prefilled
    decoding: deque = deque()       # [requests, decode steps left, first token] groups, in first-token order
    n_decoding = 0
    tpot_sum = 0.0
    while len(first) < requests or n_decoding:
        room = budget - n_decoding
        prefill, finished_prefill = 0, 0
        while len(first) + finished_prefill < requests and room > 0 and \
                started - len(first) - finished_prefill + n_decoding < admit + 1:
            if left == 0:
                if started >= requests or started - len(first) + n_decoding >= admit:
                    break
                started += 1
                left = prompt
            take = left if not chunked else min(left, room)
            if take > room and prefill:   # an unchunked prompt waits for a step of its own
                break
            prefill += take
            room -= take
            left -= take
            if left == 0:
                finished_prefill += 1
        s = step(n_decoding, prefill, ctx_prefill, ctx_decode)
        t += s
        for group in decoding:
            group[1] -= 1
        while decoding and decoding[0][1] <= 0:
            count, _, started_t = decoding.popleft()
            n_decoding -= count
            tpot_sum += count * (t - started_t) / (output - 1)
        if finished_prefill:
            first += [t] * finished_prefill
            if output > 1:
                decoding.append([finished_prefill, output - 1, t])
                n_decoding += finished_prefill
        if not prefill and not n_decoding and len(first) < requests and started >= requests:
            break   # nothing can move (cannot happen with a sane budget): never loop forever
    return first, (tpot_sum / len(first) if first and output > 1 else 0.0), t
