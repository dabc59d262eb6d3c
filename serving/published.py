"""Published end-to-end serving runs (serving/published_rows.py maps each row to a setup) predicted with the
steady-state model: a Predictor prices a run's steps once per setup, a PredictorPool prices many in forked
processes, and rate_within_limits bisects the highest request rate within a run's p99 latency limits."""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import replace

from cost.engines import ENGINES, ServingOverheads
from cost.estimate import Parallelism
from cost.profile import HardwareProfile, load_profile, with_device_suffixes
from tracer.model_source import resolve_model
from tracer.work import TraceOptions

from .batch_latency import BatchLatency, static_batch
from .capacity import on_demand_kv, output_kv_share
from .lengths import bundled_for_run
from .published_rows import METRICS, PublishedRun, load_published, map_row
from .speculative import speculative_step
from .steady_state import RATE, Limits, SteadyState, solve
from .step_cost import StepCost


# vLLM before 0.8 runs its V0 engine, which on ROCm does not turn chunked prefill on for long-context models
# (vllm/engine/arg_utils.py EngineArgs.create_engine_config, 0.6-0.7: `... and not current_platform.is_rocm()`),
# so benchmark_latency's LLM prefills whole prompts, up to max(max_model_len, 2048) tokens a step
# (vllm/config.py SchedulerConfig.__post_init__; max_model_len defaults to the config's max_position_embeddings),
# and runs at most 256 sequences (EngineArgs.max_num_seqs)
V0_RELEASES = ("0.5", "0.6", "0.7")


def trtllm_bench_limits(kv_tokens: int, isl: int, osl: int) -> tuple[int, int]:
    """The (max batch size, max num tokens) trtllm-bench builds an engine with for a dataset of isl/osl
    requests (tensorrt_llm/bench/build/tuning.py): as many requests as the KV cache holds at isl + osl tokens
    (at most 4096), the tokens a step needs to keep them fed (at most 32768), both rounded up to coarse steps."""
    requests = min(kv_tokens / (isl + osl), 4096)
    tokens = min(requests * (1 + isl / osl), 32768)
    step = 32 if requests < 256 else 128 if requests < 1024 else 256
    seqs = max(64, step * math.ceil(requests / step)) if requests < 256 else step * math.ceil(requests / step)
    step = 256 if tokens < 4096 else 512 if tokens < 8192 else 1024
    return seqs, max(2048, step * math.ceil(tokens / step))


class Predictor:
    """Predicts published runs; step shapes are traced and priced once per (model, device, formats, layout)."""

    def __init__(self, hw: HardwareProfile | None = None, logged_kv: bool = True):
        """`hw`: price every run on this profile (a calibration's candidate, serving/calibrate_serving.py), joined
        and capped as the run's device says; by default each run on its own device's profile. `logged_kv`: a run
        that states the KV capacity its engine logged (PublishedRun.kv_cache_tokens) is priced at it; False: at
        tracecost's estimate from memory, as every other run."""
        self.hw, self.logged_kv = hw, logged_kv
        self._costs: dict = {}

    def estimating_kv(self) -> "Predictor":
        """This predictor, its priced steps shared, pricing every run at tracecost's KV estimate (logged_kv off)."""
        other = Predictor(self.hw, logged_kv=False)
        other._costs = self._costs
        return other

    def profile(self, run: PublishedRun) -> HardwareProfile:
        return load_profile(run.device) if self.hw is None else with_device_suffixes(self.hw, run.device)

    def cost(self, run: PublishedRun) -> StepCost:
        attention_dp = run.replicas if run.attention_dp else 1
        key = (run.model, run.device, run.engine, run.release, run.dtype, run.kv_dtype, run.tp, run.ep, attention_dp,
               run.speculation, run.streams)
        if key not in self._costs:
            spec, hw = resolve_model(run.model), self.profile(run)
            options = TraceOptions(dtype=run.dtype, kv_cache_dtype=run.kv_dtype)
            self._costs[key] = speculative_step(
                StepCost(spec, hw, options, "engine", Parallelism(run.tp, ep=run.ep, attention_dp=attention_dp),
                         run.engine, release=run.release, streams=run.streams), run.speculation)
        return self._costs[key]

    def limits(self, run: PublishedRun, cost: StepCost) -> Limits:
        d = cost.defaults
        seqs = run.max_num_seqs or d.max_num_seqs
        tokens = run.max_batched_tokens or d.max_batched_tokens
        chunked = d.chunked_prefill if run.chunked_prefill is None else run.chunked_prefill
        if run.trtllm_bench and run.max_num_seqs is None:
            kv_tokens = self.kv_tokens(run, cost, d.max_batched_tokens)
            seqs, tokens = trtllm_bench_limits(kv_tokens, run.isl, run.osl)
        kv_tokens = self.kv_tokens(run, cost, tokens, seqs)
        return Limits(seqs, tokens, kv_tokens, chunked or tokens < run.isl,
                      output_kv_share=output_kv_share(run.engine, run.capacity_scheduler),
                      on_demand=on_demand_kv(run.engine, run.capacity_scheduler, d.cache_block_tokens,
                                             cost.spare_kv_slots),
                      prefill_apart=d.prefill_apart and not run.mixed_chunk)

    def kv_tokens(self, run: PublishedRun, cost: StepCost, max_batched_tokens: int,
                  max_num_seqs: int | None = None) -> int:
        """One replica's KV capacity in tokens: the one its engine logged where the run states it (and
        `logged_kv`), else what the engine's memory budget leaves (StepCost.replica_memory)."""
        if self.logged_kv and run.kv_cache_tokens:
            return run.kv_cache_tokens
        return cost.replica_memory(max_batched_tokens, run.memory_fraction, max_num_seqs).kv_tokens

    @staticmethod
    def cached_tokens(run: PublishedRun, cost: StepCost) -> int:
        """Prompt tokens served from the prefix cache: whole KV blocks of the stated share, and never the last
        prompt token, which every engine recomputes to sample the first output token."""
        block = cost.defaults.cache_block_tokens
        return min(run.isl - 1, math.floor(run.isl * run.prefix_hit_rate)) // block * block

    def batch_scheduler(self, run: PublishedRun, cost: StepCost, limits: Limits) -> tuple[int, int, bool, str]:
        """(tokens per step, sequences, chunked prefill, which rule) one static batch is scheduled with."""
        if run.chunked_prefill is None and run.engine == "vllm" and run.release in V0_RELEASES \
                and cost.hw.vendor.lower() == "amd":
            max_model_len = int(cost.spec.config.get("max_position_embeddings") or 2048)
            return max(max_model_len, 2048), 256, False, "V0 on ROCm: whole prompts"
        return limits.max_batched_tokens, limits.max_num_seqs, limits.chunked_prefill, "the engine's defaults"

    def batch(self, run: PublishedRun, overheads: ServingOverheads | None = None) -> tuple[BatchLatency, str]:
        """One static batch of `run.load.requests` (benchmark_latency.py) walked step by step, the walk
        `text_generate --output-length` prints (serving/batch_latency.py), and the scheduling rule it ran under."""
        cost = self.cost(run)
        with self._overheads(run, cost, overheads):
            tokens, seqs, chunked, rule = self.batch_scheduler(run, cost, self.serving_limits(run, cost))
            return static_batch(cost, run.load.requests, run.isl, run.osl, tokens, seqs, chunked), rule

    def serving_limits(self, run: PublishedRun, cost: StepCost) -> Limits:
        """The run's limits, refused where its KV cache cannot hold one request: a setup that serves nothing is
        refused, not priced as ~0 tokens/s."""
        limits = self.limits(run, cost)
        need = run.isl + limits.output_kv_share * run.osl
        if limits.kv_tokens < need:
            raise ValueError(f"the KV cache holds {limits.kv_tokens} tokens, less than one request's "
                             f"{need:.0f} (weights, reserve and activations leave too little memory)")
        return limits

    @contextmanager
    def _overheads(self, run: PublishedRun, cost: StepCost, overheads: ServingOverheads | None):
        """The cost priced with `overheads` (default: its release's), at the run's scheduler steps."""
        fitted = cost.overheads
        if overheads is not None:
            cost.overheads = overheads
        if run.scheduler_steps > 1:     # vLLM's multi-step scheduling: the scheduler runs once per k decode steps
            cost.overheads = replace(cost.overheads, step_us=cost.overheads.step_us / run.scheduler_steps)
        try:
            yield
        finally:
            cost.overheads = fitted

    def predict(self, run: PublishedRun, overheads: ServingOverheads | None = None) \
            -> tuple[dict, SteadyState | None]:
        """The run's mean metrics, and the steady state behind them (None for one static batch, which is walked)."""
        if run.mode == "offline_batch":
            walk, _ = self.batch(run, overheads)
            return {"e2e_latency_ms": walk.latency_s * 1e3, "ttft_ms": walk.stats(walk.ttft_s)["mean"] * 1e3,
                    "tpot_ms": walk.stats(walk.tpot_s).get("mean", 0.0) * 1e3,
                    "output_tok_s": walk.output_tokens_per_s * run.replicas}, None
        cost = self.cost(run)
        with self._overheads(run, cost, overheads):
            lengths = bundled_for_run(run.lengths, run.osl, run.isl) if run.lengths else None
            limits = self.serving_limits(run, cost)
            # one server process takes in every replica's requests (each replica sees 1/replicas of them)
            frontend_s = cost.intake_s(run.chat_requests) * run.replicas / run.api_servers if run.api_servers else 0.0
            state = solve(cost.steady, run.isl, run.osl, self.cached_tokens(run, cost), run.load, limits,
                          cost.overheads.request_ms * 1e-3, lengths=lengths, frontend_s=frontend_s,
                          tokens_per_step=cost.tokens_per_step)
        return {"ttft_ms": state.ttft_s["mean"] * 1e3, "tpot_ms": state.tpot_s * 1e3,
                "output_tok_s": state.output_tokens_per_s * run.replicas}, state


_FORKED: dict = {}   # the Predictor a forked worker prices with (set before the pool forks, so each inherits it)


def _predict_priced(predictor: Predictor, job):
    run, overheads = job
    try:
        return run, predictor.predict(run, overheads)[0], None
    except (ValueError, RuntimeError) as e:      # a row tracecost cannot price: the caller reports it
        return run, None, str(e)


def _with_forked_predictor(job):
    fn, item = job
    return fn(_FORKED["predictor"], item)


class PredictorPool:
    """Prices many runs, in `jobs` forked processes when jobs > 1; each worker keeps its own warm Predictor for
    as long as the pool lives (a fit prices the same rows many times)."""

    def __init__(self, predictor: Predictor, jobs: int = 1):
        self.predictor = predictor
        self._pool = None
        if jobs > 1:
            from multiprocessing import get_context
            _FORKED["predictor"] = predictor
            self._pool = get_context("fork").Pool(jobs)

    def map(self, runs, overheads: ServingOverheads | None = None):
        """(run, predicted metrics or None, why not or None) for each run, in order."""
        return self.apply(_predict_priced, [(run, overheads) for run in runs], chunksize=4)

    def apply(self, fn, items, chunksize: int = 1):
        """fn(predictor, item) for each item, in order, in the workers (fn a module-level function)."""
        if self._pool is not None:
            return self._pool.imap(_with_forked_predictor, [(fn, item) for item in items], chunksize=chunksize)
        return (fn(self.predictor, item) for item in items)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def rate_within_limits(predictor: Predictor, run: PublishedRun, limits: dict | None = None) -> float:
    """The highest request rate (whole deployment, requests/s) whose predicted p99 TTFT and TPOT stay within the
    run's latency limits (MLPerf's Server/Interactive p99 limits), by bisection on a stable steady state."""
    limits = limits or run.latency_limits
    if not limits or run.load.kind != RATE:
        raise ValueError(f"{run.id}: no latency limits or not a request-rate run")

    def within(rate: float) -> bool:
        trial = replace(run, load=replace(run.load, value=rate / run.replicas, requests=0))
        try:
            _, state = predictor.predict(trial)
        except (ValueError, RuntimeError):
            return False
        tpot_p99 = (state.tpot_q_s or {}).get("p99", state.tpot_s)
        return state.stable and state.ttft_s["p99"] * 1e3 <= limits["ttft_ms"] and \
            tpot_p99 * 1e3 <= limits["tpot_ms"]

    try:        # a setup refused at any load (a KV cache that holds no request) has no rate, not a rate of 0
        predictor.predict(replace(run, load=replace(run.load, requests=0)))
    except (ValueError, RuntimeError) as e:
        raise ValueError(str(e)) from None
    lo, hi = 0.0, max(1.0, run.load.value * run.replicas)
    while within(hi) and hi < 1e6:
        lo, hi = hi, hi * 2
    if lo == 0.0 and not within(hi * 1e-3):
        return 0.0
    while hi - lo > 0.005 * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if within(mid) else (lo, mid)
    return lo


__all__ = ["ENGINES", "METRICS", "Predictor", "PredictorPool", "PublishedRun", "load_published", "map_row",
           "rate_within_limits"]
