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

Under open-loop load with variable arrivals the running batch is not the fixed point but a distribution
(serving/load_queue.py): the engine admits greedily, so bursts fill the batch to its cap and queue behind it.
TPOT is then a distribution too (the batch a request decodes in, and which of its steps carry prefill), and
TTFT adds the wait for a slot. Lengths may vary per request (serving/lengths.py): the step uses the mean
lengths, the KV admission the running mix (long outputs stay longer), TTFT each prompt class's own chunks.
"""
from __future__ import annotations

import math
from dataclasses import replace

from .lengths import LengthDistribution, fixed_lengths
from .load_queue import (LIFE_AVERAGE_VARIANCE, MIN_PEAKEDNESS, NO_WAIT, Wait, batch_law, normal_mix_quantiles,
                         peakedness, ttft_quantiles)
from .metrics import percentile
from .operating_point import CONCURRENCY, MAX, QUANTILES, RATE, Limits, Load, SteadyState
from .server_intake import server_entries, shared_wait
from .step_moments import settled_step, whole_prompt_moments
from .step_walk import walk as _walk

# a finite closed loop is walked step by step up to this many steps (about 2 s); a longer run keeps its steady state
FINITE_RUN_STEPS = 200_000


def _joined(*notes: str) -> str:
    return "; ".join(n for n in notes if n)


def admitted(limits: Limits, input_tokens: int, output_tokens: int, cached_tokens: int = 0,
             shared_prefix_kv: bool = False, kv_per_request: float | None = None) -> int:
    """Requests an engine runs at once: max_num_seqs, or as many requests (input + the engine's share of the
    output KV, and any recurrent state) as its cache holds; a shared prefix counts once. `kv_per_request`: a
    mix's mean over the running requests (serving/lengths.py residence_mean) instead."""
    shared = cached_tokens if shared_prefix_kv else 0
    whole = input_tokens + limits.output_kv_share * output_tokens if kv_per_request is None else kv_per_request
    if limits.on_demand is not None:      # what a request holds beyond its tokens: a part-filled block, spare slots
        whole += limits.on_demand.slack_tokens
    kv = (whole - shared if limits.attention_kv else 0) + limits.state_tokens
    return max(1, min(limits.max_num_seqs, int(max(0, limits.kv_tokens - shared) // max(1, kv))))


def solve(step, input_tokens: int, output_tokens: int, cached_tokens: int, load: Load, limits: Limits,
          request_overhead_s: float = 0.0, shared_prefix_kv: bool = False,
          lengths: LengthDistribution | None = None, frontend_s: float = 0.0,
          tokens_per_step: float = 1.0, quantiles: tuple[int, ...] = QUANTILES,
          recompute_tokens: float = 0.0) -> SteadyState:
    """`step(decoding, prefill_tokens, chunk_tokens, chunk_context, decode_context)`: seconds of one engine step
    (serving/step_cost.py StepCost.steady). `shared_prefix_kv`: the cached prefix is one prefix every request
    shares, held once in the KV cache rather than once per request (the RFC's default counts it per request).
    `lengths`: per-request lengths; when given, input_tokens and output_tokens are ignored (its means are used,
    with its spread), and every request's first `cached_tokens` tokens hit the prefix cache. `frontend_s`: the
    serial per-request time of the HTTP server in front of this replica (cost/engines.py
    ServingOverheads.frontend_ms and chat_template_ms, StepCost.intake_s), which shares its time among the
    requests it holds (serving/server_intake.py): a burst enters the engine together, once all of it is taken in.
    `tokens_per_step`: the tokens a decoding request gains per step (speculative decoding's mean accepted tokens,
    serving/speculative.py; `step` then prices a speculative step), 1 otherwise. `quantiles`: the TTFT and TPOT percentiles to compute
    beside the means (a search comparing means asks for none: inverting the distributions was a third of a solve);
    a finite run walked step by step reports them all. `recompute_tokens`: prefill tokens per request of the
    requests a full KV cache preempts (the solve sets it where the cache binds with requests waiting;
    serving/preemption.py)."""
    if lengths is not None:
        input_tokens = lengths.mean_input
        o = max(1.0, lengths.mean_output)
        prompts = [(w, max(1, i - cached_tokens)) for w, i in lengths.classes("input", 16)]
        outputs = lengths.classes("output", 16)
        ctx_decode = lengths.residence_mean(lambda i, out: i + out / 2)
        whole = lengths.residence_mean(lambda i, out: i + out)
        admit = admitted(limits, 0, 0, cached_tokens, shared_prefix_kv,
                         lengths.residence_mean(lambda i, out: i + limits.output_kv_share * out))
        mean_out = lengths.mean_output
        residence_variation = sum(w * (x - mean_out) ** 2 for w, x in outputs) / mean_out ** 2
        described = lengths.describe()
    else:
        o = max(1, output_tokens)
        prompts, outputs = [(1.0, max(1, input_tokens - cached_tokens))], [(1.0, o)]
        ctx_decode = input_tokens + o // 2
        whole = input_tokens + o
        admit = admitted(limits, input_tokens, o, cached_tokens, shared_prefix_kv)
        residence_variation = 0.0
        described = fixed_lengths(input_tokens, o)
    prompt = sum(w * x for w, x in prompts)
    work = prompt + recompute_tokens     # prefill tokens per request: its prompt and its share of the recompute
    decode_steps = (o - 1) / tokens_per_step     # steps a request decodes for
    budget = limits.max_batched_tokens
    # prompts are prefilled in chunks of up to the budget, each over the cached prefix and earlier chunks
    chunk = min(prompt, budget) if limits.chunked_prefill else prompt
    chunk_context = cached_tokens + (prompt - chunk) / 2
    engine_step = step
    priced: dict = {}

    def step(n: float, p: float) -> float:
        t = priced.get((n, p))
        if t is None:
            t = priced[(n, p)] = engine_step(n, p, chunk, chunk_context, ctx_decode)
        return t

    lumpy = not (load.kind == RATE and load.arrival == "constant")
    # squared coefficient of variation of the arrivals: Poisson 1; every k-th of a Poisson stream (round robin
    # over k engines) 1/k; evenly spaced 0
    arrival_variation = (1.0 / max(1, load.spread) if load.arrival == "poisson" else 0.0) \
        if load.kind == RATE else 0.0
    z = peakedness(arrival_variation, residence_variation)

    def prefill_capacity(n: float) -> float:
        """Prompt tokens one step takes beside `n` decodes."""
        capacity = max(1.0, budget - n)
        return capacity if limits.chunked_prefill else max(capacity, prompt)   # a whole prompt, budget or not

    moments: dict = {}     # (running, prefill tokens) -> step_moments: loads and fixed points revisit them

    def step_moments(n: float, p: float) -> tuple[float, float]:
        key = (n, p)
        if key not in moments:
            moments[key] = whole_prompt_moments(step, n, p, prefill_capacity(n), prompt, lumpy,
                                                load.spread)
        return moments[key]

    def mean_step(n: float, p: float) -> float:
        return step_moments(n, p)[0]

    states: dict = {}      # rate -> state(rate): feasible() and result() both ask for it

    def state(rate: float) -> tuple[float, float, float]:
        if rate not in states:
            states[rate] = fixed_point(rate)
        return states[rate]

    def shapes(rate: float, s: float) -> tuple[float, float]:
        # past the admission and budget limits the load is infeasible anyway: never price absurd shapes
        return min(rate * decode_steps * s, 2.0 * admit + 2), min(rate * work * s, 2.0 * budget)

    def fixed_point(rate: float) -> tuple[float, float, float]:
        """(running, prefill tokens per step, step seconds) at `rate`: the s with s = mean step(n(s), p(s))
        (serving/step_moments.py settled_step)."""
        def after(s: float) -> float:
            n, p = shapes(rate, s)
            # the steps a decoding request sees hold it too: at a light load a step of one, not of a fraction
            return mean_step(max(n, 1.0), p)
        s = settled_step(after, step(0, min(prompt, budget)))
        return (*shapes(rate, s), s)

    def own_prefill_steps(n: float) -> float:
        capacity = prefill_capacity(n)
        return sum(w * math.ceil(x / capacity) for w, x in prompts)

    def residence_steps(n: float) -> float:
        """Steps a request holds its slot: its prompt's chunks and its O - 1 decodes."""
        return decode_steps + own_prefill_steps(n)

    def moments_at(rate: float, running: float) -> tuple[float, float]:
        """Mean and mean square of a step with `running` requests in their slots at `rate` (the prefill tokens
        a step carries keep up with the arrivals: p = R I' s, solved for s by the secant method: the mean step
        is nearly linear in its prefill tokens)."""
        key = (rate, running)
        if key in at_rate:
            return at_rate[key]
        decoding = max(1.0, running * decode_steps / residence_steps(running))

        def gap(s: float) -> float:
            return mean_step(decoding, min(rate * work * s, 2.0 * budget)) - s

        a = step(decoding, 0.0)
        b = mean_step(decoding, min(rate * work * a, 2.0 * budget))
        ga, gb = gap(a), gap(b)
        for _ in range(12):
            if abs(gb) <= 1e-6 * b or gb == ga:
                break
            a, b = b, max(a * 1e-3, b - gb * (b - a) / (gb - ga))
            ga, gb = gb, gap(b)
        at_rate[key] = step_moments(decoding, min(rate * work * b, 2.0 * budget))
        return at_rate[key]

    at_rate: dict = {}

    def full_batch_rate(rate: float) -> float:
        """Requests/s the engine completes with every slot taken (the open-loop queue's service rate)."""
        return admit / (residence_steps(admit) * moments_at(rate, admit)[0])

    def prefill_service(n: float) -> float:
        """Seconds of prefill capacity one request takes: its share of a step full of prefill."""
        capacity = prefill_capacity(n)
        return work / capacity * step(n, capacity)

    def batch(rate: float, deterministic: bool):
        """[(share, running, step mean, step mean square)] of the running batch at `rate`, and the admission
        wait."""
        if deterministic or z < MIN_PEAKEDNESS:
            n, p, s = state(rate)
            mean, square = step_moments(max(n, 1.0), p)
            return [(1.0, n, mean, square)], NO_WAIT
        law = batch_law(rate, admit, residence_steps(admit), lambda m: moments_at(rate, m)[0], z)
        if not law.stable:
            return batch(rate, True)
        grid = law.grid
        table = [moments_at(rate, m) for m in grid]
        cells = []
        for w, m in law.points:
            hi = next((j for j, g in enumerate(grid) if g >= m), len(grid) - 1)
            lo = max(0, hi - 1)
            f = 0.0 if grid[hi] == grid[lo] else min(1.0, max(0.0, (m - grid[lo]) / (grid[hi] - grid[lo])))
            mean = table[lo][0] + f * (table[hi][0] - table[lo][0])
            square = table[lo][1] + f * (table[hi][1] - table[lo][1])
            cells.append((w, m * decode_steps / residence_steps(m), mean, square))
        return cells, law.admission

    def tpot_quantiles(cells, qs: tuple[int, ...]) -> dict:
        """A request's TPOT: the mean of its O - 1 steps, each drawn from the steps at the batch it decodes in
        (which of them carry a prefill chunk is random), that batch averaged over its life."""
        e = tokens_per_step
        mean = sum(w * m for w, _, m, _ in cells) / e
        keep = math.sqrt(LIFE_AVERAGE_VARIANCE)
        parts = [(w * v, mean + keep * (m / e - mean), math.sqrt(max(0.0, sq - m * m) / max(1.0, (x - 1) / e)) / e)
                 for w, _, m, sq in cells for v, x in outputs]
        return {"mean": mean, **(normal_mix_quantiles(parts, qs) if qs else {})}

    def ttft(n: float, s: float, square: float, poisson: bool, rate: float, admission, qs: tuple[int, ...],
             intake: Wait = NO_WAIT, idle: bool = False) -> dict:
        """A request waits for the rest of the step under way, for a slot when every slot is taken, for the
        prompts queued ahead (M/G/1 under Poisson arrivals), then for its own prefill step(s), which also carry
        the prompts that arrived with it during the step under way (Poisson). A Poisson arrival more likely
        lands in a long step (one with a prefill) than a short one: the step under way is the length-biased
        mean step, E[S^2] / E[S]; evenly spread arrivals see the plain mean step. `idle`: the request finds the
        engine idle, no step under way (a closed loop of one user)."""
        capacity = prefill_capacity(n)
        variation = arrival_variation if poisson else 0.0
        service = prefill_service(n)          # the prefill capacity as a server in time
        busy = min(0.999, rate * service)
        # service in proportion to each prompt's tokens: E[S^2] / E[S]^2 of the prompt mix
        spread = sum(w * x * x for w, x in prompts) / prompt ** 2
        # the prompts queued ahead (M/G/1 less the residual of the one being served, which the step under way
        # already counts), scaled as G/G/1 by the arrivals' variation (Kingman)
        wait = variation * busy * busy * service * spread / (2 * (1 - busy))
        queue_busy = busy * busy if poisson else 0.0
        waits = [admission, Wait.exponential(queue_busy, queue_busy / wait if wait > 0 else 0.0), intake]
        biased = s + variation * (square / s - s) if s > 0 else s   # the step a request arrives in
        if idle:
            biased = 0.0
        along = rate * biased                         # prompts arriving during it
        if variation > 0 and along <= 40:
            others, k, weight = [], 0, math.exp(-along)
            while k <= along + 6 * math.sqrt(along) + 6:
                others.append((weight, k))
                k += 1
                weight *= along / k
            # every spread-th request of a Poisson stream: counts vary 1/spread as much (a mix of the two)
            others = [(w * variation, k) for w, k in others] + [(1 - variation, max(0.0, along - 1.0))]
        else:
            others = [(1.0, along if variation > 0 else max(0.0, along - 1.0))]
        priced: dict = {}

        def own(x: float, j: float) -> float:
            if x > capacity:
                return math.ceil(x / capacity) * step(n, capacity)
            tokens = round(min(capacity, x + j * prompt))
            if tokens not in priced:
                priced[tokens] = step(n, tokens)
            return priced[tokens]

        classes = [(w * v, request_overhead_s + own(x, j)) for w, x in prompts for v, j in others]
        mean = sum(w * c for w, c in classes) / sum(w for w, _ in classes) + biased / 2 + \
            sum(w.mean for w in waits)
        return {"mean": mean, **(ttft_quantiles(classes, biased, waits, qs) if qs else {})}

    def feasible(rate: float) -> tuple[bool, str, tuple]:
        if rate * frontend_s > 0.98:    # the server's process cannot take requests in as fast as they come
            return False, "api server", (0.0, 0.0, 0.0)
        n, p, s = state(rate)
        binding = "max_num_seqs" if admit == limits.max_num_seqs else "kv_cache"
        if z >= MIN_PEAKEDNESS and load.kind == RATE:
            # a queue in front of the batch: stable while the full batch completes requests faster than they come
            if rate >= 0.999 * full_batch_rate(rate):
                return False, binding, (n, p, s)
        elif n + 1 > admit:
            return False, binding, (n, p, s)
        # prompts need their budget's share of prefill steps: in time, prefill must keep up with arrivals
        if n + p > budget * 0.98 or rate * prefill_service(n) > 0.98:
            return False, "prefill budget", (n, p, s)
        return True, "load", (n, p, s)

    def saturation() -> float:
        """The largest rate the replica sustains."""
        lo, hi = 0.0, 1.0
        while feasible(hi)[0] and hi < 1e7:
            lo, hi = hi, hi * 2
        while hi - lo > 1e-4 * hi:
            mid = (lo + hi) / 2
            if feasible(mid)[0]:
                lo = mid
            else:
                hi = mid
        return lo

    def result(rate: float, stable: bool, limited: str, ttft_extra: float = 0.0, note: str = "",
               deterministic: bool = False, qs: tuple[int, ...] = quantiles) -> SteadyState:
        cells, admission = batch(rate, deterministic or not stable or load.kind != RATE)
        running = sum(w * n for w, n, _, _ in cells)
        s = sum(w * m for w, _, m, _ in cells)
        square = sum(w * sq for w, _, _, sq in cells)
        poisson = load.arrival == "poisson" and load.kind == RATE
        # a closed loop of one user sends its next request when the last one ends: the engine has no step under way
        idle = load.kind == CONCURRENCY and load.value <= 1
        t = ttft(running, s, square, poisson, rate, admission, qs, intake_wait(rate, poisson), idle)
        t = {k: v + ttft_extra + frontend_s for k, v in t.items()}
        tpot = tpot_quantiles(cells, qs)
        e2e = {k: v + decode_steps * s for k, v in t.items()}
        queue = admission.mean
        return SteadyState(stable, rate, running, s, t, s / tokens_per_step, e2e, rate * o,
                           rate * (input_tokens + o), limited, note, tpot, queue, described)

    def intake_wait(rate: float, poisson: bool) -> Wait:
        """A request's time at the HTTP server beyond its own intake f, shared with the others it holds (Poisson
        arrivals; serving/server_intake.py)."""
        if frontend_s <= 0 or not poisson:
            return NO_WAIT
        return shared_wait(min(rate * frontend_s, 0.98), frontend_s)

    def walked_requests(count: int) -> list[tuple[int, int]]:
        """(prompt tokens to prefill, output tokens) of each of `count` walked requests."""
        if lengths is None:
            return [(prompts[0][1], int(o))] * count
        return [(max(1, i - cached_tokens), out) for i, out in lengths.stratified(count)]

    def full_step_recompute(recompute: float) -> float:
        """At a full batch its decoding requests complete n a / O a step, each bringing its share of the
        recompute."""
        return admit * decode_steps / residence_steps(admit) * tokens_per_step / o * recompute

    def walked(arrivals: list[float], steady: SteadyState, limited: str, note: str) -> SteadyState:
        requests = walked_requests(len(arrivals))
        entries = server_entries(arrivals, frontend_s)
        walk = _walk(step, entries, requests, admit, budget, limits.chunked_prefill, tokens_per_step,
                     full_step_recompute(recompute_tokens), prefill_apart=limits.prefill_apart)
        delays = [e - a for a, e in zip(arrivals, entries)]
        if frontend_s > 0:
            note += (f"; the HTTP server takes each request in {frontend_s * 1e3:.3g} ms, sharing its time among "
                     f"those it holds (a burst enters the engine together)")
        return _walked(walk, steady, request_overhead_s, requests, cached_tokens, limited, note, delays)

    def closed_loop() -> SteadyState:
        """Closed loop: R x E2E(R) = C, where R x E2E grows with R; solved by bisection below saturation."""
        users = load.value
        top = saturation()
        at_top = result(top * 0.999, True, "load", qs=())
        if top * 0.999 * at_top.e2e_s["mean"] <= users:
            # more users than the engine serves at once: the extra ones wait for a slot
            _, limited, _ = feasible(top * 1.01)
            again = preempting(limited, state(top * 0.999)[0])
            if again is not None:
                return again
            queued = max(0.0, users - top * at_top.e2e_s["mean"]) / top
            return result(top * 0.999, True, limited, ttft_extra=queued)
        lo, hi = 0.0, top * 0.999
        while hi - lo > 1e-5 * hi:
            mid = (lo + hi) / 2
            if mid * result(mid, True, "load", qs=()).e2e_s["mean"] < users:
                lo = mid
            else:
                hi = mid
        return result(lo, True, "load")

    def finite_run(steady: SteadyState) -> SteadyState:
        """N requests by `users` users (`vllm bench serve --max-concurrency C --num-prompts N`, sent at once or
        paced at `send_rate`): the run's throughput is its tokens over the time to its last token, so it pays for
        the ramp (users not all in yet) and the drain (the last requests finish alone; with spread lengths, the
        longest last). Walked step by step with the client's cap; the latencies stay the steady state's (a walk of
        fixed lengths keeps the users in lockstep, which spread lengths do not)."""
        if not load.requests:
            return steady
        users = max(1, round(load.value))
        steps = load.requests * (decode_steps + 1) / min(users, admit)
        if steps > FINITE_RUN_STEPS:
            return replace(steady, note=_joined(steady.note, f"{load.requests} requests by {load.value:g} users: "
                                                             f"too long a run to walk, priced in its steady state"))
        spacing = 1.0 / load.send_rate if load.send_rate else 0.0
        sends = [i * spacing for i in range(load.requests)]
        requests = walked_requests(load.requests)
        # each send passes the HTTP server (frontend_s, shared among the requests it holds) and request_overhead_s
        _, _, makespan = _walk(step, sends, requests, admit, budget, limits.chunked_prefill, tokens_per_step,
                               full_step_recompute(steady.recompute_tokens), users=users, resend_s=request_overhead_s,
                               prefill_apart=limits.prefill_apart, intake_s=frontend_s)
        rate = load.requests / makespan                  # from the first send to the last token
        mean_in = sum(i for i, _ in requests) / len(requests) + cached_tokens
        mean_out = sum(out for _, out in requests) / len(requests)
        paced = f", sent at {load.send_rate:g}/s" if load.send_rate else ", all ready at once"
        share = rate * mean_out / steady.output_tokens_per_s if steady.output_tokens_per_s > 0 else 1.0
        note = (f"{load.requests} requests by {load.value:g} users{paced}: the run's throughput over its ramp and "
                f"drain, walked step by step ({share:.3f} of the steady state's tokens/s)"
                + ("" if lengths is not None else "; fixed lengths: a spread of outputs would lengthen the drain"))
        return replace(steady, request_rate=rate, running=min(steady.running, load.requests),
                       output_tokens_per_s=rate * mean_out,
                       total_tokens_per_s=rate * (mean_in + mean_out), note=_joined(steady.note, note))

    def preempting(limited: str, running: float) -> SteadyState | None:
        """The load solved again with the recompute of the requests a full cache preempts (serving/preemption.py),
        where the KV cache binds with requests waiting; None where nothing is recomputed."""
        if limits.on_demand is None or recompute_tokens or limited != "kv_cache":
            return None
        extra = limits.on_demand.recompute_tokens(max(1.0, running), tokens_per_step, input_tokens, o, cached_tokens)
        if extra < 0.5:
            return None
        endless = replace(load, requests=0) if load.kind == CONCURRENCY else load   # finite_run walks it once
        again = solve(engine_step, input_tokens, output_tokens, cached_tokens, endless, limits, request_overhead_s,
                      shared_prefix_kv, lengths, frontend_s, tokens_per_step, quantiles, extra)
        if again.limited_by != "kv_cache":      # the recompute moved what binds: no queue behind a full cache
            return None
        again.recompute_tokens = extra
        told = f"the full KV cache preempts: {extra:.0f} tokens recomputed per request ({extra / input_tokens:.0%} " \
               f"of a prompt)"
        again.note = _joined(again.note, told)
        return again

    shared = cached_tokens if shared_prefix_kv else 0
    if limits.attention_kv and limits.kv_tokens - shared < whole - shared + limits.state_tokens:
        # not one request fits (the weights leave too little memory): no load is served
        none = result(1e-9, False, "kv_cache", note=f"the KV cache ({limits.kv_tokens} tokens) cannot hold one "
                                                      f"request ({whole:.0f} tokens)", deterministic=True)
        none.request_rate = none.output_tokens_per_s = none.total_tokens_per_s = 0.0
        return none
    if load.kind == RATE:
        ok, limited, _ = feasible(load.value)
        if ok:
            settled = result(load.value, True, "load")
            if load.requests:   # a finite run lasts from the first arrival to the last request's last token
                duration = (load.requests - 1) / load.value + settled.e2e_s["mean"]
                settled.output_tokens_per_s = load.requests * o / duration
                settled.total_tokens_per_s = load.requests * (input_tokens + o) / duration
            return settled
        top = saturation()
        _, limited, _ = feasible(top * 1.01)        # what binds at the edge, not at the offered rate
        again = preempting(limited, state(top)[0])
        if again is not None:
            return again
        note = f"offered {load.value:g} requests/s exceeds the {top:.3g} this replica sustains ({limited})"
        if not load.requests:
            return result(top, False, limited, note=note + ": queues grow without bound")
        # a finite run: the queue grows while requests arrive, then drains; walk it step by step
        spacing = 1.0 / load.value
        return walked([i * spacing for i in range(load.requests)], result(top, False, limited), limited,
                      note + f": {load.requests} requests, the queue grows while they arrive")
    if load.kind == CONCURRENCY:
        return finite_run(closed_loop())
    # maximum throughput: as many running as the engine admits, the rest queued
    top = saturation()
    _, limited, _ = feasible(top * 1.01)
    if not load.requests or load.requests > admit:     # requests wait behind the full batch
        again = preempting(limited, state(top)[0])
        if again is not None:
            return again
    steady = result(top, True, limited, deterministic=True)
    if not load.requests:
        return steady
    # a run ends with its longest outputs and starts with every prompt queued: walk it whenever the walk is
    # affordable; an engine that holds one request at a time has no steady state (no room for n + 1 running)
    if load.requests > 50000:
        if top < 1e-9:
            raise ValueError(f"the engine runs at most {admit} request(s) at once and sustains no steady rate; "
                             f"{load.requests} queued requests are too many to walk")
        # many waves: the steady state at saturation, plus the first wave's ramp and the last one's drain
        tail = lengths.longest("output") if lengths is not None else o
        makespan = load.requests / top + steady.ttft_s["mean"] + (tail - 1) * steady.tpot_s
        rate = load.requests / makespan
        waits = {k: v + load.requests / top / 2 for k, v in steady.ttft_s.items()}
        return SteadyState(True, rate, steady.running, steady.step_s, waits, steady.tpot_s,
                           {k: v + (o - 1) * steady.tpot_s for k, v in waits.items()}, rate * o,
                           rate * (input_tokens + o), limited,
                           f"{load.requests} requests queued at once (steady state over the waves)",
                           steady.tpot_q_s, 0.0, described)
    # a finite burst queued at once: its first tokens come as fast as prefill drains the queue, which
    # is not the steady state's pace (decodes have not filled the batch yet): walk the burst step by step
    return walked([0.0] * load.requests, steady, limited, f"{load.requests} requests queued at once")


def _walked(walk, steady: SteadyState, overhead_s: float, requests: list[tuple[int, int]], cached_tokens: int,
            limited: str, note: str, delays: list[float] | None = None) -> SteadyState:
    """`delays`: each request's time between its arrival and its entry into the engine (by arrival order)."""
    waits, tpots, makespan = walk
    ttft = [overhead_s + w for w in waits]
    if delays and any(delays):      # waits come in the order prompts finish, which is entry (= arrival) order
        ttft = [t + d for t, d in zip(ttft, delays)]
        makespan += delays[0]          # the walk's clock starts at the first entry, the run at the first arrival
    q = {"mean": sum(ttft) / len(ttft), **{f"p{k}": percentile(ttft, k) for k in (50, 90, 99)}}
    tpot_mean = sum(tpots) / len(tpots) if tpots else 0.0
    tpot = {"mean": tpot_mean, **{f"p{k}": percentile(tpots, k) or 0.0 for k in (50, 90, 99)}}
    o = sum(out for _, out in requests) / len(requests)
    tokens_in = sum(p for p, _ in requests) / len(requests) + cached_tokens
    rate = len(waits) / makespan
    return SteadyState(True, rate, min(steady.running, len(requests)), steady.step_s, q, tpot_mean,
                       {k: v + (o - 1) * tpot_mean for k, v in q.items()}, rate * o,
                       rate * (tokens_in + o), limited, note, tpot, 0.0, steady.lengths)


__all__ = ["CONCURRENCY", "FINITE_RUN_STEPS", "MAX", "QUANTILES", "RATE", "Limits", "Load", "SteadyState", "admitted",
           "solve"]
