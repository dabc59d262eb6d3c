"""text_generate --output-length N: B requests of Q prompt tokens served to the end, as `vllm bench latency`
runs one batch: prefill in the engine's chunks, every decode step over its growing context
(serving/batch_latency.py), then TTFT, TPOT, the batch's end-to-end latency and tokens/s.
"""
from __future__ import annotations

from dataclasses import dataclass

from cost.estimate import Parallelism
from cost.profile import HardwareProfile, load_profile
from serving.batch_latency import BatchLatency, static_batch
from serving.speculative import Speculation, StepTimes, speculative_step, step_times
from serving.step_cost import StepCost
from tracer.model_source import ModelSpec
from tracer.table import format_table
from tracer.trace import trace
from tracer.work import Request

from .config import InputError


@dataclass(frozen=True)
class WholeRequest:
    model: str
    hw: HardwareProfile
    tp: int
    ep: int
    engine: str
    dtype: str
    max_batched_tokens: int
    max_num_seqs: int
    chunked: bool
    walk: BatchLatency
    kv_tokens: int | None        # what the engine's KV cache holds (engine execution), None under eager
    notes: tuple[str, ...]
    speculation: Speculation | None = None
    speculative_step: StepTimes | None = None   # the batch's step at its mean decode context, when speculating

    @property
    def kv_needed(self) -> int:
        """KV tokens the running requests hold at their end."""
        w = self.walk
        return min(w.batch, self.max_num_seqs) * (w.prompt + w.output)

    @property
    def warnings(self) -> list[str]:
        out = []
        if self.kv_tokens is not None and self.kv_needed > self.kv_tokens:
            out.append(f"the batch needs {self.kv_needed:,} KV tokens but the engine's cache holds "
                       f"{self.kv_tokens:,}: the engine would preempt and recompute requests, which this walk does "
                       f"not model (serving_sim does); latency is optimistic")
        if self.walk.batch > self.max_num_seqs:
            out.append(f"the batch of {self.walk.batch} exceeds max_num_seqs {self.max_num_seqs}: the rest wait "
                       f"for a slot (modelled)")
        return out

    def as_json(self) -> dict:
        w = self.walk
        # a statistic with no samples (one output token has no TPOT) is null, not an empty object
        ms = lambda stats: {k: v * 1e3 for k, v in stats.items()} or None  # noqa: E731
        return {"model": self.model, "device": self.hw.name, "phase": "whole_request",
                "engine": self.engine if self.kv_tokens is not None else None,
                "execution": "engine" if self.kv_tokens is not None else "eager",
                "tp_size": self.tp, "ep_size": self.ep, "dtype": self.dtype,
                "request": {"num_queries": w.batch, "query_length": w.prompt, "output_length": w.output},
                "scheduler": {"max_batched_tokens": self.max_batched_tokens, "max_num_seqs": self.max_num_seqs,
                              "chunked_prefill": self.chunked},
                "ttft_ms": ms(w.stats(w.ttft_s)), "tpot_ms": ms(w.stats(w.tpot_s)),
                "e2e_latency_ms": w.latency_s * 1e3, "steps_ms": w.steps_s * 1e3,
                "outside_steps_ms": w.outside_s * 1e3,
                "output_tokens_per_s": w.output_tokens_per_s, "total_tokens_per_s": w.total_tokens_per_s,
                "prefill_steps": w.prefill_steps, "decode_steps": len(w.steps) - w.prefill_steps,
                "steps": [{"prefill_chunks": [list(c) for c in s.chunks], "decode_batch": s.decode_batch,
                           "decode_context": s.decode_context, "ms": s.seconds * 1e3} for s in w.steps],
                "kv_tokens_needed": self.kv_needed, "kv_tokens_capacity": self.kv_tokens,
                "speculation": self.speculation.label if self.speculation else None,
                "speculative_step": self.speculative_step.as_json() if self.speculative_step else None,
                "notes": list(self.notes)}


def predict(spec: ModelSpec, device: str, batch: int, prompt: int, output: int, tp: int, ep: int, execution: str,
            options, engine: str, ep_style: str, release: str | None = None, max_batched_tokens: int | None = None,
            max_num_seqs: int | None = None, chunked_prefill: bool = True,
            speculation: Speculation | None = None) -> WholeRequest:
    hw = load_profile(device)
    if speculation is not None and execution != "engine":
        raise InputError("--speculative prices a serving engine's steps: use --execution engine")
    cost = speculative_step(StepCost(spec, hw, options, execution, Parallelism(tp, ep, ep_style), engine,
                                     release=release), speculation)
    d = cost.defaults
    tokens, seqs = max_batched_tokens or d.max_batched_tokens, max_num_seqs or d.max_num_seqs
    chunked = (d.chunked_prefill and chunked_prefill) or (chunked_prefill and prompt > tokens)
    kv = cost.replica_memory(tokens).kv_tokens if execution == "engine" else None
    if kv == 0:
        raise InputError(f"{spec.name} leaves no memory for a KV cache on {hw.name} at TP={tp}: raise --tp-size")
    walk = static_batch(cost, batch, prompt, output, tokens, seqs, chunked)
    notes = [f"scheduler: {tokens:,} tokens per step (max_num_batched_tokens), {seqs} requests at once "
             f"(max_num_seqs), {'chunked prefill' if chunked else 'whole prompts per step'}"
             f"{'' if max_batched_tokens else ' (the engine defaults; --max-prefill-tokens/--max-running change them)'}"
             + ("" if chunked or prompt <= tokens else f"; a {prompt}-token prompt beyond the budget runs whole"),
             "every step priced on its own shapes (StepCost: power-of-two shape buckets, linear between them, as "
             "serving_sim prices steps); no prefix-cache hits"]
    if execution == "engine":
        notes.append(f"step overheads: {cost.overhead_origin}; TTFT and finish include "
                     f"{cost.overheads.request_ms:g} ms per request outside the steps")
    notes += cost.formats_notes()
    dtype = trace(spec, Request(1, 1, 0), options).options.dtype   # "auto" resolved to the config's format
    times = None
    if speculation is not None:   # the step at the batch's mean decode context, what each decode step resembles
        times = step_times(cost, min(batch, seqs), prompt + output // 2)
        notes.append("speculative step: the batch's decode step at its mean context (prompt + half the output); "
                     "the walk prices every step at its own context and advances each request by the mean tokens "
                     "per step")
    return WholeRequest(spec.name, hw, tp, ep, engine, dtype, tokens, seqs, chunked, walk, kv, tuple(notes),
                        speculation, times)


def render(r: WholeRequest) -> str:
    w = r.walk
    ttft, tpot = w.stats(w.ttft_s), w.stats(w.tpot_s)
    how = f"{r.engine} engine" if r.kv_tokens is not None else "HF eager execution"
    lines = [f"{r.model} on {r.hw.name} x{r.tp} (TP={r.tp}{f', EP={r.ep}' if r.ep > 1 else ''}), {how}, {r.dtype}",
             f"whole request: {w.batch} x ({w.prompt} prompt -> {w.output} output tokens), one batch as "
             f"`vllm bench latency` runs it",
             ""]
    rows = [["TTFT", *(f"{ttft[k] * 1e3:,.2f}" for k in ("mean", "p50", "p99"))]]
    if tpot:
        rows.append(["TPOT", *(f"{tpot[k] * 1e3:,.3f}" for k in ("mean", "p50", "p99"))])
    lines.append(format_table(["per request, ms", "mean", "p50", "p99"], rows))
    lines.append("")
    decode_steps = len(w.steps) - w.prefill_steps
    lines.append(format_table(["batch", "value"], [
        ["end-to-end latency", f"{w.latency_s * 1e3:,.1f} ms"],
        ["output tokens/s", f"{w.output_tokens_per_s:,.0f}"],
        ["total tokens/s", f"{w.total_tokens_per_s:,.0f}"],
        ["steps with prefill", f"{w.prefill_steps}"],
        ["decode-only steps", f"{decode_steps}"],
        ["sum of steps", f"{w.steps_s * 1e3:,.1f} ms"]]))
    if r.speculative_step is not None:
        from .speculative_step import section
        lines += ["", section(r.speculative_step, r.speculation)]
    for warning in r.warnings:
        lines.append(f"WARNING: {warning}")
    for note in r.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)
