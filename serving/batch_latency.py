"""One static batch served to the end, step by step, as `vllm bench latency` (benchmark_latency.py) runs it:
`batch` requests of `prompt` tokens arrive together and each generates `output` tokens.

The scheduler is the engine's (serving/engine.py, after vllm/v1/core/sched/scheduler.py) for a batch with no
prefix hits and a KV cache that holds it: each step has a token budget (max_num_batched_tokens); running
requests take their next tokens first (a decode token, or the next chunk of a prompt), then waiting requests
are admitted in order while budget and slots (max_num_seqs) last. Without chunked prefill (vLLM's V0
scheduler, vllm/core/scheduler.py _schedule_default) a step prefills whole prompts up to the budget, or
decodes every running request, never both. Every step is priced on its own shapes by StepCost (its own
power-of-two buckets and interpolation, as serving_sim prices steps).
"""
from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

from .step_cost import StepCost


@dataclass(frozen=True)
class BatchStep:
    chunks: tuple[tuple[int, int], ...]   # prefill chunks: (tokens, tokens already in the KV cache)
    decode_batch: int                     # requests decoding one token
    decode_context: int                   # their mean context
    seconds: float


@dataclass(frozen=True)
class BatchLatency:
    """Per request: time to first token, time per output token after it, finish; all from the batch's start,
    including the engine's per-request work outside the steps (`outside_s`)."""
    batch: int
    prompt: int
    output: int
    steps: tuple[BatchStep, ...]
    ttft_s: tuple[float, ...]
    tpot_s: tuple[float, ...]             # empty when output == 1
    finish_s: tuple[float, ...]
    outside_s: float

    @property
    def latency_s(self) -> float:
        """The whole batch, what benchmark_latency.py reports: the last request's finish."""
        return max(self.finish_s)

    @property
    def steps_s(self) -> float:
        return sum(s.seconds for s in self.steps)

    @property
    def prefill_steps(self) -> int:
        return sum(1 for s in self.steps if s.chunks)

    @property
    def output_tokens_per_s(self) -> float:
        return self.batch * self.output / self.latency_s

    @property
    def total_tokens_per_s(self) -> float:
        return self.batch * (self.prompt + self.output) / self.latency_s

    def stats(self, values: tuple[float, ...]) -> dict[str, float]:
        if not values:
            return {}
        ordered = sorted(values)
        return {"mean": statistics.fmean(ordered), "p50": _percentile(ordered, 50), "p90": _percentile(ordered, 90),
                "p99": _percentile(ordered, 99)}


def _percentile(ordered: list[float], q: float) -> float:
    """Linear between order statistics (numpy's default, which vLLM's benchmarks use)."""
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def static_batch(cost: StepCost, batch: int, prompt: int, output: int, max_batched_tokens: int,
                 max_num_seqs: int, chunked: bool = True) -> BatchLatency:
    """Walk the batch step by step until every request has its `output` tokens."""
    if min(batch, prompt, output, max_batched_tokens, max_num_seqs) < 1:
        raise ValueError("batch, prompt, output, max_batched_tokens and max_num_seqs must be >= 1")
    computed = [0] * batch          # tokens with KV
    generated = [0] * batch
    # a speculative step (serving/speculative.py) gains each decoding request its mean accepted tokens
    gain = cost.tokens_per_step
    ttft, finish = [0.0] * batch, [0.0] * batch
    waiting, running = deque(range(batch)), []
    steps, clock = [], 0.0
    while waiting or running:
        chunks, decodes = (_schedule_chunked if chunked else _schedule_whole)(
            computed, prompt, running, waiting, max_batched_tokens, max_num_seqs)
        context = round(sum(computed[i] for i in decodes))
        shapes = tuple((n, computed[i]) for i, n in chunks)
        seconds = cost.step(list(shapes), len(decodes), context // len(decodes) if decodes else 0)
        clock += seconds
        steps.append(BatchStep(shapes, len(decodes), context // len(decodes) if decodes else 0, seconds))
        done = []
        for i in decodes:
            step_gain = min(gain, output - generated[i])
            computed[i] += step_gain
            generated[i] += step_gain
            if generated[i] >= output - 1e-9:
                done.append(i)
        for i, n in chunks:
            computed[i] += n
            if computed[i] == prompt:    # the prompt is in: its first token is sampled in this step
                generated[i], ttft[i] = 1, clock
                if output == 1:
                    done.append(i)
        for i in done:
            finish[i] = clock
        if done:
            gone = set(done)
            running[:] = [i for i in running if i not in gone]
    outside = cost.overheads.request_ms * 1e-3   # once per request, as the simulator's records carry it
    tpot = tuple((finish[i] - ttft[i]) / (output - 1) for i in range(batch)) if output > 1 else ()
    return BatchLatency(batch, prompt, output, tuple(steps), tuple(t + outside for t in ttft), tpot,
                        tuple(f + outside for f in finish), outside)


def _schedule_chunked(computed, prompt, running, waiting, budget, max_num_seqs):
    """Running requests first (a decode token, or the next chunk of the prompt), then admissions in order."""
    chunks, decodes = [], []
    for i in running:
        if budget <= 0:
            break
        if computed[i] < prompt:
            n = min(prompt - computed[i], budget)
            chunks.append((i, n))
            budget -= n
        else:
            decodes.append(i)
            budget -= 1
    while waiting and budget > 0 and len(running) < max_num_seqs:
        i = waiting.popleft()
        running.append(i)
        n = min(prompt, budget)
        chunks.append((i, n))
        budget -= n
    return chunks, decodes


def _schedule_whole(computed, prompt, running, waiting, budget, max_num_seqs):
    """vLLM V0 without chunked prefill: a prefill step of whole prompts while any can be admitted (the first
    one even when it is longer than the budget, as an engine whose budget is the model's length runs it),
    else a decode step of every running request."""
    chunks = []
    while waiting and len(running) < max_num_seqs and (not chunks or budget >= prompt):
        i = waiting.popleft()
        running.append(i)
        chunks.append((i, prompt))
        budget -= prompt
    return chunks, ([] if chunks else list(running))
