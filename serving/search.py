"""The serving layout with the most throughput within latency limits, from the steady-state model.

For each layout (serving/layouts.py) a replica's step costs come from StepCost and its KV capacity from the
engine's memory budget (serving/capacity.py). At a given load the steady state (serving/steady_state.py)
gives TTFT, TPOT and throughput. Without a load, the search finds the highest request rate whose latencies
stay within the limits: the load a deployment is sized for.

Disaggregated candidates split the GPUs into prefill instances (prompt-only steps, their TTFT a queue at the
chunked-prefill budget, plus the KV transfer) and decode instances (decode-only steps at the batch the
rate sustains), each pool with its own TP, and balance the two rates.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from cost.engines import ServingOverheads
from cost.parallel import LayoutError, nodes_spanned
from cost.profile import HardwareProfile
from tracer.model_source import ModelSpec
from tracer.trace import trace
from tracer.work import Request, TraceOptions

from .capacity import ReplicaMemory, at_logged_capacity, on_demand_kv, output_kv_share
from .layouts import Layout
from .lengths import LengthDistribution, fixed_lengths
from .slo import STATS, LatencyLimits, goodput_estimate
from .steady_state import CONCURRENCY, MAX, QUANTILES, RATE, Limits, Load, SteadyState, admitted, solve
from .speculative import Speculation, SpeculativeStep, speculative_step
from .step_cost import StepCost

MIXED, DISAGG = "mixed", "disagg"
# a logged KV capacity this far above tracecost's estimate is more than the memory holds (the estimate is within 5% of
# the logs it was checked on, docs/speculative.md): said in the notes
LOGGED_KV_PLAUSIBLE = 1.25
# how far off a capacity can be and still be called right (the development set's highest-rate-within-limits
# median error is ~6%): an answer that moves by more than a quarter over this is flagged (Searcher.rate_sensitivity)
NEAR_CAPACITY_SPREAD = 0.05


@dataclass(frozen=True)
class Workload:
    input_tokens: int
    output_tokens: int
    cached_tokens: int = 0        # prefix-cache hits per request (the RFC's cached_prefix_tokens)
    shared_prefix_kv: bool = False   # the hits are one shared prefix, stored once in the KV cache
    lengths: LengthDistribution | None = None   # per-request lengths (input/output_tokens are then its means)

    def describe(self) -> str:
        return self.lengths.describe() if self.lengths is not None else \
            fixed_lengths(self.input_tokens, self.output_tokens)

    @property
    def longest_request(self) -> int:
        """Prompt and output tokens of the longest request (with a length distribution: its longest input plus its
        longest output, an upper bound)."""
        if self.lengths is not None:
            return self.lengths.longest("input") + self.lengths.longest("output")
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True)
class EngineSettings:
    engine: str = "vllm"
    execution: str = "engine"
    max_num_seqs: int | None = None          # None: the engine's default
    max_batched_tokens: int | None = None
    memory_fraction: float | None = None
    overheads: ServingOverheads | None = None
    release: str | None = None               # the engine release whose overheads price a step (None: newest)
    speculation: Speculation | None = None   # speculative decoding (serving/speculative.py), None: none
    streams: bool = True                     # clients stream their tokens (cost/engines.py ServingOverheads.stream_us)
    capacity_scheduler: str | None = None    # TensorRT-LLM's KV admission policy (serving/capacity.py), None: default
    chat_requests: bool = True               # clients send chat completions (StepCost.intake_s), else completions
    kv_cache_tokens: int | None = None       # the KV capacity per replica the engine logged (None: estimated)


@dataclass
class Candidate:
    mode: str
    layout: Layout
    request_rate: float                # requests/s of the whole deployment
    running: float                     # requests decoding per replica (mean)
    ttft_ms: dict
    tpot_ms: float
    e2e_ms: dict
    output_tokens_per_s: float
    total_tokens_per_s: float
    gpus: int
    memory: ReplicaMemory | None
    max_num_seqs: int
    max_batched_tokens: int
    kv_tokens: int
    limited_by: str
    meets_limits: bool
    why_not: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    prefill: Layout | None = None      # disaggregated pools
    prefill_instances: int = 0
    decode_instances: int = 0
    verified: dict | None = None       # the simulator's numbers for the same setup (--verify)
    tpot_stats_ms: dict = field(default_factory=dict)   # a request's TPOT: mean, p50, p90, p99
    queue_ms: float = 0.0              # mean wait for a slot in the running batch
    speculation: str | None = None     # the speculative setup's label (mtp k=2), None: none
    goodput: float = 0.0               # requests/s within every limit (serving/slo.py)
    overload: bool = False             # the load is beyond what it serves (serving/overload.py)
    recompute_tokens: float = 0.0      # prefill tokens per request of requests a full KV cache preempts

    @property
    def label(self) -> str:
        """What to deploy: `mixed TP2 DP4`, or `disagg P3xTP2 D1xTP4` (prefill and decode instances)."""
        if self.mode == DISAGG:
            one = lambda lay: f"TP{lay.tp}" + (f" EP{lay.ep}" if lay.ep > 1 else "")  # noqa: E731
            return f"disagg P{self.prefill_instances}x{one(self.prefill)} D{self.decode_instances}x{one(self.layout)}"
        return f"{self.mode} {self.layout.label}"

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.output_tokens_per_s / max(1, self.gpus)

    @property
    def tokens_per_s_per_user(self) -> float:
        return 1000.0 / self.tpot_ms if self.tpot_ms > 0 else 0.0

    def as_json(self) -> dict:
        out = {"mode": self.mode, **self.layout.as_json(), "request_rate": self.request_rate,
               "batch_size": self.running, "ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms, "e2e_ms": self.e2e_ms,
               "output_tokens_per_s": self.output_tokens_per_s, "total_tokens_per_s": self.total_tokens_per_s,
               "output_tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
               "tokens_per_s_per_user": self.tokens_per_s_per_user, "gpus": self.gpus,
               "max_num_seqs": self.max_num_seqs, "max_batched_tokens": self.max_batched_tokens,
               "kv_tokens_per_replica": self.kv_tokens, "limited_by": self.limited_by,
               "meets_limits": self.meets_limits, "why_not": self.why_not, "notes": self.notes,
               "tpot_stats_ms": self.tpot_stats_ms, "queue_ms": self.queue_ms,
               "goodput_requests_per_s": self.goodput, "overload": self.overload, "speculation": self.speculation,
               "recompute_tokens_per_request": self.recompute_tokens}
        if self.memory is not None:
            m = self.memory
            out["memory_gb_per_gpu"] = {"weights": m.weights / 1e9, "activations": m.activations / 1e9,
                                        "reserve": m.reserve / 1e9, "kv_cache": m.kv_cache / 1e9}
        if self.mode == DISAGG:
            out["prefill"] = {**self.prefill.as_json(), "instances": self.prefill_instances}
            out["decode"] = {**self.layout.as_json(), "instances": self.decode_instances}
        if self.verified is not None:
            out["verified"] = self.verified
        return out


def _ms(d: dict) -> dict:
    return {k: v * 1e3 for k, v in d.items()}


class Searcher:
    """Prices layouts; each (layout, engine) has one StepCost, so every shape is traced and priced once."""

    def __init__(self, spec: ModelSpec, hw: HardwareProfile, options: TraceOptions, workload: Workload,
                 settings: EngineSettings, limits: LatencyLimits):
        self.spec, self.hw, self.options, self.w, self.settings, self.limits = \
            spec, hw, options, workload, settings, limits
        self._costs: dict = {}

    def with_workload(self, workload: Workload) -> "Searcher":
        """The same deployment searched at another workload, sharing this one's step costs (a step's price does
        not depend on the workload)."""
        other = Searcher(self.spec, self.hw, self.options, workload, self.settings, self.limits)
        other._costs = self._costs
        return other

    # -- one replica -------------------------------------------------------------------------------------------
    def cost(self, layout: Layout) -> StepCost | SpeculativeStep:
        par = layout.parallelism
        if par not in self._costs:
            self._costs[par] = speculative_step(
                StepCost(self.spec, self.hw, self.options, self.settings.execution, par, self.settings.engine,
                         self.settings.overheads, self.settings.release, self.settings.streams),
                self.settings.speculation)
        return self._costs[par]

    def estimated_memory(self, layout: Layout) -> ReplicaMemory:
        """One replica's memory as tracecost estimates it under the engine's budget and limits."""
        cost = self.cost(layout)
        d = cost.defaults
        return cost.replica_memory(self.settings.max_batched_tokens or d.max_batched_tokens,
                                   self.settings.memory_fraction, self.settings.max_num_seqs or d.max_num_seqs)

    def engine_limits(self, layout: Layout) -> tuple[Limits, ReplicaMemory]:
        cost = self.cost(layout)
        d = cost.defaults
        seqs = self.settings.max_num_seqs or d.max_num_seqs
        budget = self.settings.max_batched_tokens or d.max_batched_tokens
        mem = self.estimated_memory(layout)
        if self.settings.kv_cache_tokens:
            mem = at_logged_capacity(mem, self.settings.kv_cache_tokens)
        # pipeline stages run pp micro-batches in flight: pp virtual engines, each with its share of the cache
        pp = layout.pp
        engine, policy = self.settings.engine, self.settings.capacity_scheduler
        return Limits(max(1, seqs // pp), budget, mem.kv_tokens // pp, d.chunked_prefill,
                      mem.state_tokens_per_sequence, mem.attention_kv, output_kv_share(engine, policy),
                      on_demand_kv(engine, policy, d.cache_block_tokens, cost.spare_kv_slots),
                      prefill_apart=d.prefill_apart), mem

    @property
    def _limit_quantiles(self) -> tuple[int, ...]:
        """The percentiles the limits read (none for means): all a search's probes need."""
        return () if self.limits.stat == "mean" else (int(self.limits.stat[1:]),)

    def replica_state(self, layout: Layout, load: Load, quantiles: tuple[int, ...] = QUANTILES) \
            -> tuple[SteadyState, Limits, ReplicaMemory]:
        """The steady state of one virtual engine (a replica, or one pipeline micro-batch stream of it)."""
        limits, mem = self.engine_limits(layout)
        cost = self.cost(layout)
        engines = layout.dp * layout.pp
        if load.kind == MAX:    # a finite burst is dealt round robin over the engines
            per_engine = replace(load, requests=math.ceil(load.requests / engines))
        else:
            per_engine = replace(load, value=load.value / engines, spread=engines,
                                 requests=math.ceil(load.requests / engines))
        # each engine instance takes its requests in through its own HTTP server
        state = solve(cost.steady, self.w.input_tokens, self.w.output_tokens, self.w.cached_tokens, per_engine,
                      limits, cost.overheads.request_ms * 1e-3, self.w.shared_prefix_kv, self.w.lengths,
                      cost.intake_s(self.settings.chat_requests), cost.tokens_per_step, quantiles)
        return state, limits, mem

    def mixed(self, layout: Layout, load: Load, probe: bool = False) -> Candidate:
        """The layout at `load`. A `probe` computes only the statistic the limits read (whether they are met, and
        that statistic, are exact; other percentiles and the goodput are left out): what a search's bisection
        compares, before the answer is solved in full."""
        cost = self.cost(layout)
        state, limits, mem = self.replica_state(layout, load, self._limit_quantiles if probe else QUANTILES)
        engines = layout.dp * layout.pp
        ttft, tpot, tpot_stats = _ms(state.ttft_s), state.tpot_s * 1e3, _ms(state.tpot_q_s)
        why = self.limits.why_not(ttft, tpot, tpot_stats)
        longest = self.w.longest_request
        if mem.kv_tokens < longest:
            why = [f"memory: {mem.kv_tokens} KV tokens per replica cannot hold one request "
                   f"({mem.weights / 1e9:.1f} GB of weights per GPU)"]
        elif not state.stable:
            why.append(state.note)
        notes = [f"step overheads: {cost.overhead_origin}", self.w.describe()] + cost.formats_notes()
        if self.settings.kv_cache_tokens:
            estimated = self.estimated_memory(layout).kv_tokens
            notes.append(f"KV cache: {mem.kv_tokens:,} tokens per replica as the engine logged them "
                         f"(--kv-cache-tokens); tracecost's estimate from memory: {estimated:,}"
                         + (f"; {mem.kv_tokens / max(1, estimated):.1f}x what the memory holds beside the weights "
                            f"by tracecost's count: check the number" if mem.kv_tokens > LOGGED_KV_PLAUSIBLE * estimated
                            else ""))
        if state.stable and state.note:
            notes.append(state.note)
        if self.w.lengths is not None:
            notes.append("lengths: steps are priced at the mean lengths; prompt classes set TTFT, the running mix "
                         "sets KV admission, the output spread sets TPOT percentiles")
        if layout.pp > 1:
            notes.append(f"pipeline: {layout.pp} micro-batches in flight, stages of ceil(layers / {layout.pp}) "
                         f"layers (x{cost.stage_factor:.3f} for imbalance)")
        return Candidate(MIXED, layout, state.request_rate * engines, state.running * layout.pp, ttft, tpot,
                         _ms(state.e2e_s), state.output_tokens_per_s * engines, state.total_tokens_per_s * engines,
                         layout.gpus, mem, limits.max_num_seqs * layout.pp, limits.max_batched_tokens,
                         mem.kv_tokens, state.limited_by, not why, why, notes,
                         tpot_stats_ms=tpot_stats, queue_ms=state.queue_s * 1e3,
                         speculation=self.settings.speculation.label if self.settings.speculation else None,
                         goodput=goodput_estimate(state.request_rate * engines, ttft, tpot_stats, self.limits)
                         if state.stable and mem.kv_tokens >= longest else 0.0,
                         recompute_tokens=state.recompute_tokens)

    def rate_sensitivity(self, layout: Layout, load: Load, spread: float = NEAR_CAPACITY_SPREAD) -> str | None:
        """A note when the mean TTFT or TPOT at this rate moves by more than a quarter for the rate `spread` either
        side, as a capacity that far off would move it: near saturation a step barely faster per request carries
        the rate with a much smaller batch, so the mean there is a range, not a number."""
        if load.kind != RATE or not self.replica_state(layout, load, ())[0].stable:
            return None       # beyond capacity already: the overload warning says so
        ttft, tpot = [], []
        for f in (1 - spread, 1 + spread):
            state, _, _ = self.replica_state(layout, replace(load, value=load.value * f), ())
            if not state.stable:
                return (f"near capacity: {f:.2f} x this rate is beyond what the layout serves, so with a capacity "
                        f"{spread:.0%} lower requests would queue without bound")
            ttft.append(state.ttft_s["mean"] * 1e3)
            tpot.append(state.tpot_s * 1e3)
        if tpot[1] > 1.25 * tpot[0] or ttft[1] > 1.25 * ttft[0]:
            return (f"near capacity: at {1 - spread:.2f}-{1 + spread:.2f} x this rate (a capacity {spread:.0%} off) "
                    f"the mean TPOT is {tpot[0]:.1f}-{tpot[1]:.1f} ms and the mean TTFT {ttft[0]:.0f}-{ttft[1]:.0f} ms")
        return None

    def best_rate(self, layout: Layout) -> Candidate:
        """The highest request rate this layout serves within the limits (the saturation rate without limits)."""
        # the bisection probes (limits' statistic only); the rate it settles on is solved in full
        saturated = self.mixed(layout, Load(RATE, 1e9), probe=True)
        top = saturated.request_rate
        if top <= 0 or saturated.why_not and saturated.why_not[0].startswith("memory"):
            return self.mixed(layout, Load(RATE, 1e9))
        best = None
        lo, hi = 0.0, top * 0.999
        if self.mixed(layout, Load(RATE, hi), probe=True).meets_limits:
            return self.mixed(layout, Load(RATE, hi))
        for _ in range(24):
            mid = (lo + hi) / 2
            if self.mixed(layout, Load(RATE, mid), probe=True).meets_limits:
                best, lo = mid, mid
            else:
                hi = mid
            if hi - lo <= 0.005 * hi:
                break
        # the rate found, solved in full (a trickle's numbers when not even a trickle of load meets the limits)
        return self.mixed(layout, Load(RATE, max(top * 1e-3, 1e-6) if best is None else best))

    def best_goodput(self, layout: Layout) -> Candidate:
        """The request rate with the most goodput (requests/s within every limit): a grid over the rates the
        layout can serve, then a golden-section search between the best point's neighbours (goodput rises with
        the rate until the limits start to fail, then falls)."""
        saturated = self.mixed(layout, Load(RATE, 1e9))
        top = saturated.request_rate * 0.999
        if top <= 0 or saturated.why_not and saturated.why_not[0].startswith("memory"):
            return saturated
        grid = [top * f for f in (0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)]
        scored = [self.mixed(layout, Load(RATE, r)) for r in grid]
        i = max(range(len(grid)), key=lambda k: scored[k].goodput)
        lo, hi = grid[max(0, i - 1)], grid[min(len(grid) - 1, i + 1)]
        best = scored[i]
        golden = 0.618
        for _ in range(10):
            a, b = hi - golden * (hi - lo), lo + golden * (hi - lo)
            ca, cb = self.mixed(layout, Load(RATE, a)), self.mixed(layout, Load(RATE, b))
            if ca.goodput >= cb.goodput:
                hi = b
            else:
                lo = a
            best = max((best, ca, cb), key=lambda c: c.goodput)
        return best

    # -- disaggregated pools -----------------------------------------------------------------------------------
    def prefill_capacity(self, layout: Layout, ttft_budget_ms: float | None) -> tuple[float, SteadyState]:
        """Requests/s one prefill instance sustains with its TTFT (queue + prefill + transfer) in budget, and its
        steady state there (TTFT's mean and the limits' statistic)."""
        cost = self.cost(layout)
        limits, _ = self.engine_limits(layout)

        def at(rate: float) -> SteadyState:   # TTFT's limit statistic only: what the bisection compares
            return solve(cost.steady, self.w.input_tokens, 1, self.w.cached_tokens, Load(RATE, rate), limits,
                         cost.overheads.request_ms * 1e-3, frontend_s=cost.intake_s(self.settings.chat_requests),
                         quantiles=self._limit_quantiles)

        top = at(1e9).request_rate * 0.999
        if ttft_budget_ms is None:
            return top, at(top)
        lo, hi, best = 0.0, top, None
        for _ in range(24):
            mid = (lo + hi) / 2
            s = at(mid)
            if s.stable and s.ttft_s[self.limits.stat] * 1e3 <= ttft_budget_ms:
                lo, best = mid, s
            else:
                hi = mid
        return lo, best if best is not None else at(max(top * 1e-3, 1e-6))

    def decode_capacity(self, layout: Layout) -> tuple[float, float, float]:
        """(requests/s, running, TPOT s) of one decode instance at the largest batch within the TPOT limit."""
        cost = self.cost(layout)
        limits, _ = self.engine_limits(layout)
        ctx = self.w.input_tokens + self.w.output_tokens // 2
        # decode instances hold whole requests and ignore the prefix cache
        admit = admitted(limits, self.w.input_tokens, self.w.output_tokens)
        per_token = 1.0 / cost.tokens_per_step      # a speculative step advances a request several tokens
        best = (0.0, 0.0, cost.steady(1, 0, 1, 0, ctx) * per_token)
        n = 1
        while n <= admit:
            s = cost.steady(n, 0, 1, 0, ctx) * per_token
            if self.limits.tpot_target_ms is not None and s * 1e3 > self.limits.tpot_target_ms:
                break
            best = (n / (max(1, self.w.output_tokens - 1) * s), n, s)
            n = n * 2 if n * 2 <= admit or n == admit else admit
        return best

    def disagg(self, prefill: Layout, decode: Layout, num_gpus: int, offered: float | None = None) \
            -> Candidate | None:
        """The best split of `num_gpus` into prefill and decode instances; at an `offered` rate the pools serve
        that rate when they can (their capacity otherwise)."""
        kv_per_token = trace(self.spec, Request(1, 1, 1, decode=True), self.options).kv_bytes_per_token
        # inside one scale-up domain (a node, an NVL72 rack) the KV moves on the interconnect, else on the network
        link, gbps = ((self.hw.interconnect_name, self.hw.interconnect_bandwidth_gbps)
                      if num_gpus <= self.hw.scale_up_gpus or self.hw.scale_out_bandwidth_gbps <= 0
                      else (self.hw.scale_out_name or "the scale-out network", self.hw.scale_out_bandwidth_gbps))
        transfer_s = kv_per_token * self.w.input_tokens / (gbps * 1e9)
        target = self.limits.ttft_target_ms
        ttft_budget = None if target is None else target - transfer_s * 1e3
        if ttft_budget is not None and ttft_budget <= 0:
            return None
        need = self.w.input_tokens + self.w.output_tokens
        if self.engine_limits(prefill)[1].kv_tokens < self.w.input_tokens or \
                self.engine_limits(decode)[1].kv_tokens < need:
            return None       # an instance that cannot hold one request (weights fill its memory)
        rate_p, state_p = self.prefill_capacity(prefill, ttft_budget)
        rate_d, running, tpot_s = self.decode_capacity(decode)
        if rate_p <= 0 or rate_d <= 0:
            return None
        best = None
        for p in range(1, num_gpus // prefill.gpus_per_replica + 1):
            d = (num_gpus - p * prefill.gpus_per_replica) // decode.gpus_per_replica
            if d < 1:
                break
            rate = min(p * rate_p, d * rate_d)
            if best is None or rate > best[0]:
                best = (rate, p, d)
        if best is None:
            return None
        rate, p, d = best
        if offered is not None and offered < rate:
            rate = offered
        if rate < d * rate_d:
            # decode instances below capacity (the offered rate, or a prefill pool that feeds them less than they
            # serve) run smaller batches: n = r (O - 1) s(n) at their share r
            ctx = self.w.input_tokens + self.w.output_tokens // 2
            share, cost_d, n = rate / d, self.cost(decode), 1.0
            for _ in range(60):
                tpot_s = cost_d.steady(max(n, 1.0), 0, 1, 0, ctx) / cost_d.tokens_per_step
                n_new = share * max(1, self.w.output_tokens - 1) * tpot_s
                if abs(n_new - n) <= 1e-6 * max(n, 1.0):
                    break
                n = 0.5 * (n + n_new)
            running = n
            rate_d = rate / d
        # the prefill pool at the balanced rate: its queue is shorter than at capacity
        cost_p = self.cost(prefill)
        limits_p, mem_p = self.engine_limits(prefill)
        at = solve(cost_p.steady, self.w.input_tokens, 1, self.w.cached_tokens, Load(RATE, rate / p), limits_p,
                   cost_p.overheads.request_ms * 1e-3, frontend_s=cost_p.intake_s(self.settings.chat_requests))
        ttft = {k: (v + transfer_s) * 1e3 for k, v in at.ttft_s.items()}
        tpot = tpot_s * 1e3
        o = self.w.output_tokens
        gpus = p * prefill.gpus_per_replica + d * decode.gpus_per_replica
        why = self.limits.why_not(ttft, tpot)
        limits_d, mem_d = self.engine_limits(decode)
        decode_layout = replace(decode, dp=d)
        return Candidate(DISAGG, decode_layout, rate, running, ttft, tpot,
                         {k: v + (o - 1) * tpot for k, v in ttft.items()}, rate * o,
                         rate * (self.w.input_tokens + o), gpus, mem_d,
                         limits_d.max_num_seqs, limits_p.max_batched_tokens,
                         mem_d.kv_tokens, "balanced pools", not why, why,
                         [f"KV transfer {transfer_s * 1e3:.2f} ms per request over {link}",
                          "decode instances ignore the prefix cache; prefill instances use it",
                          self.w.describe() + (" (disaggregated pools priced at its mean lengths)"
                                               if self.w.lengths is not None else "")]
                         + self.cost(decode).formats_notes(),
                         replace(prefill, dp=p), p, d,
                         goodput=goodput_estimate(rate, ttft, {"mean": tpot}, self.limits))


def layout_error(layout: Layout, hw: HardwareProfile) -> str | None:
    try:
        nodes_spanned(layout.gpus_per_replica if not layout.attention_dp else layout.gpus, hw)
    except LayoutError as e:
        return str(e)
    return None


__all__ = ["CONCURRENCY", "Candidate", "DISAGG", "EngineSettings", "LatencyLimits", "MAX", "MIXED", "RATE",
           "STATS", "Searcher", "Workload", "layout_error"]
