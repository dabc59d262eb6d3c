"""Time of one engine step, from the tracer and cost model.

A step runs the decode tokens of every running request plus prefill chunks (chunked prefill). Its time is
the non-attention work of all the step's tokens, the attention of each prefill chunk over its context, and
the decode attention; then what the engine spends beyond its kernels (cost/engines.py): sampling every
scheduled sequence, the scheduler's host work per step and per sequence, the rank synchronization of a
multi-GPU replica, and eager launches when a decode batch exceeds the CUDA-graph sizes the engine captured.
Shapes are bucketed to powers of two and interpolated, so a long simulation traces only a few dozen distinct
shapes. Recomputing a preempted request is a prefill like any other.
"""
from __future__ import annotations

import math
from dataclasses import replace
from functools import cached_property

import numpy as np

from cost.engine_pricing import decode_rows_in_prefill
from cost.engines import ENGINES, ServingOverheads, nearest_release, scheduled_ahead, serving_overheads
from cost.estimate import Parallelism, estimate, sampling_seconds
from cost.op_formats import expert_resident, is_formats_note
from cost.parallel import point_to_point_seconds
from cost.execution import ENGINE
from cost.profile import HardwareProfile
from cost.provenance import kernel_origin
from tracer.model_source import ModelError, ModelSpec
from tracer.trace import trace
from tracer.work import Request, TraceOptions

from .capacity import ReplicaMemory, replica_memory
from .derived_trace import attention_work, derive, outside_attention


ASYNC_NOTE = ("; scheduled asynchronously: the scheduler's host work per step (step_us, and seq_us and stream_us per "
              "running request) runs while the GPU computes the step before, and only what exceeds the GPU's step "
              "adds to it")


def step_overheads(hw: HardwareProfile, engine: str, release: str | None = None,
                   asked: str | None = None) -> tuple[ServingOverheads, str]:
    """The engine's step overheads on `hw` and their origin: fitted with this device's kernel scaling on its own
    cluster (`engines.serving_fit`, serving/calibrate_serving.py), else the engine's fit (cost/engine_serving.json)."""
    on_device = hw.serving_fit_overheads(engine)
    if on_device:
        return (ServingOverheads.from_json(on_device[0], f"{hw.path}: engines.serving_fit.overheads"),
                f"fitted on this device: {on_device[1]}")
    return serving_overheads(engine, release, asked)


STEADY_MEMO = 1 << 18    # steady-state steps remembered per StepCost (a sweep of many loads starts afresh past it)


def _pow2_at_least(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 1 else 1


class StepCost:
    tokens_per_step = 1.0     # tokens a decoding request gains per step (serving/speculative.py: more)
    spare_kv_slots = 0        # KV slots a running request holds beyond its tokens (a speculative step's drafts)
    speculation = None        # a speculative setup (serving/speculative.py SpeculativeStep), None: none
    async_scheduling = False  # the scheduler's host work runs under the GPU's step (cost/engines.py AsyncScheduling)

    def __init__(self, spec: ModelSpec, hw: HardwareProfile, options: TraceOptions, execution: str,
                 par: Parallelism | int, engine: str = "vllm", overheads: ServingOverheads | None = None,
                 release: str | None = None, streams: bool = False):
        """`release`: the engine release priced: its kernels where the device has tables of it
        (HardwareProfile.at_engine_release), its overheads, or the nearest release's that has them."""
        self.par = par if isinstance(par, Parallelism) else Parallelism(par)
        if execution == ENGINE and release:
            hw = hw.at_engine_release(release)
        self.streams = streams       # every step returns each running request's tokens to its client
        self.spec, self.hw, self.options, self.execution, self.tp = spec, hw, options, execution, self.par.tp
        self.engine, self.release = engine, release
        self.defaults = ENGINES[engine].serving_defaults(hw.memory_capacity_gb, hw.name)
        if execution == ENGINE:
            fitted, self.overhead_origin = step_overheads(hw, engine, nearest_release(engine, release), release)
            self.overheads = overheads or fitted
            if self.overheads.kernel_time != 1.0:
                self.overhead_origin += (f"; this release's kernels take {self.overheads.kernel_time:.3g}x the time "
                                         f"the kernel fits give")
            if self.overheads.stream_us > 0:
                self.overhead_origin += (f"; tokens streamed: {self.overheads.stream_us:g} us per running request per "
                                         f"step" if streams else "; tokens returned with each completion (no stream)")
            self.async_scheduling = scheduled_ahead(engine, release, self.par.pp)
            if self.async_scheduling:
                self.overhead_origin += ASYNC_NOTE
        else:   # HF eager pays its host time inside each step already
            self.overheads, self.overhead_origin = ServingOverheads(0, 0, 0, 0, 0), "none (eager execution)"
        # where every number of this cost comes from (said first by each command when carried over)
        self.origin = kernel_origin(hw, engine if execution == ENGINE else None, self.overhead_origin)
        text = spec.config.get("text_config") or {}
        self.vocab = int(spec.config.get("vocab_size") or text.get("vocab_size") or 32000)
        self.hidden = int(spec.config.get("hidden_size") or text.get("hidden_size") or 4096)
        self.num_layers = int(spec.config.get("num_hidden_layers") or text.get("num_hidden_layers") or 1)
        self._launches: dict = {}
        self._cache: dict = {}
        self._linear: dict = {}
        self._logits: dict = {}      # rows bucket -> seconds of the output projection of that many rows
        self._prefill: dict = {}     # (token bucket, context bucket) -> attention seconds per token
        self._decode: dict = {}      # (batch bucket, context bucket, beside a chunk) -> seconds per sequence
        self._decode_at: dict = {}   # (batch bucket, context, beside a chunk) -> per sequence, interpolated
        self._prefill_at: dict = {}  # (token bucket, context, sequences bucket) -> per token, interpolated
        self._sampled: dict = {}     # rows -> sampling seconds
        self._memory: dict = {}      # (step tokens, memory fraction, reserve) -> ReplicaMemory
        self.shared = None           # a mapping shared by processes running a sweep: each shape traced once
        self._formats_notes: list[str] | None = None
        self._affine_prefill: tuple | None = None   # _prefill_bases(), once asked
        self._attention_kernels = 0
        self._buckets: dict = {}     # power-of-two tokens -> linear seconds
        self._steady: dict = {}      # steady()'s arguments -> seconds, at these overheads

    @property
    def overheads(self) -> ServingOverheads:
        return self._overheads

    @overheads.setter
    def overheads(self, value: ServingOverheads) -> None:
        """A fit tries overheads on the same StepCost (serving/calibrate_serving.py): the remembered steady-state
        steps were priced with the old ones."""
        self._overheads = value
        self._steady = {}

    def intake_s(self, chat: bool = True) -> float:
        """Seconds the engine's HTTP server spends in series on each request before handing it to the engine: its
        fitted frontend_ms, and for a chat request chat_template_ms where the server renders the prompt from the
        model's Jinja chat template (not where the engine renders this model type its own way)."""
        o = self.overheads
        rendered = chat and self.spec.config.get("model_type") not in ENGINES[self.engine].own_chat_renderers
        return (o.frontend_ms + (o.chat_template_ms if rendered else 0.0)) * 1e-3

    def _trace(self, request: Request):
        """The trace of one step shape; a model with no KV cache has no step a serving engine runs."""
        traced = trace(self.spec, request, self.options)
        if traced.recomputes_context:   # its steps are not a cached decode plus new tokens
            raise ModelError(f"{self.spec.name} keeps no KV cache, so every step recomputes the whole sequence: "
                             f"tracecost prices its single steps (text_generate without --output-length), not serving")
        return traced

    def _parts(self, request: Request, mixed: bool = False) -> tuple[float, float]:
        """(seconds without attention, attention seconds) of one forward; `mixed`: its decode rows share the step
        with a prompt chunk (mixed_decode_attention)."""
        parts = self._cache.get((request, mixed))
        if parts is None:
            key = (request.num_queries, request.query_length, request.context_length, request.decode) + \
                (("mixed",) if mixed else ())
            parts = self.shared.get(key) if self.shared is not None else None
            if parts is None:
                e = estimate(self._trace(request), self.hw, self.execution, self.par, self.engine, mixed_step=mixed)
                parts = (_outside_attention(e), e.breakdown_s["attention"])
                self._launches[request.query_length] = e.num_kernels
                if self.shared is not None:
                    self.shared[key] = parts
            self._cache[(request, mixed)] = parts
        return parts

    def formats_notes(self) -> list[str]:
        """The weight format each kind of GEMM runs in (cost/op_formats.py), and how the layout's collectives and
        expert slots are priced, from a one-token step."""
        if self._formats_notes is None:
            one = trace(self.spec, Request(1, 1, 0), self.options)
            e = estimate(one, self.hw, self.execution, self.par, self.engine)
            self._formats_notes = [n for n in e.notes if is_formats_note(n)] + e.layout_notes
            if self.mixes_decode_rows:
                cal = self.hw.engine(self.engine)
                if any(op.attention is not None and decode_rows_in_prefill(op.attention, cal) for op in one.ops):
                    how = ("the query heads of a KV head packed into one" if cal.mixed_step_decodes["packs_gqa"]
                           else "one per query head")
                    self._formats_notes.append(
                        f"{ENGINES[self.engine].label} kernels: a step's decode rows, where the step also carries a "
                        f"prompt chunk, priced in its prefill kernel, a query tile per row ({how}), not on its decode "
                        f"kernel (the profile's engines.{self.engine}.mixed_step_decodes says why; docs/engines.md)")
        return self._formats_notes

    def linear(self, tokens: int) -> float:
        """Everything but attention for a step of `tokens` tokens, interpolated between power-of-two shapes."""
        if tokens <= 0:
            return 0.0
        t = self._linear.get(tokens)
        if t is None:
            t = self._linear[tokens] = _pow2_lerp(self._linear_bucket, tokens)
        return t

    def _linear_bucket(self, tokens: int) -> float:
        """Everything but attention in a prefill step of `tokens` tokens (a power of two). Engine steps beyond the
        base counts are priced from a trace derived from two traced ones (serving/derived_trace.py: ops affine in
        the tokens, routed experts by their expected active count), once the derivation gives a traced step op for
        op (_prefill_bases); otherwise, and in HF eager steps, each bucket is traced."""
        seconds = self._buckets.get(tokens)
        if seconds is None:
            derived = self._derived_prefill(tokens) if tokens > 2 and self.execution == ENGINE else None
            if derived is None:
                seconds = self._parts(Request(1, tokens, 0))[0]
            else:
                e = estimate(derived, self.hw, self.execution, self.par, self.engine)
                self._launches[tokens] = e.num_kernels + self._attention_kernels
                seconds = _outside_attention(e)
            self._buckets[tokens] = seconds
        return seconds

    def _derived_prefill(self, tokens: int):
        if self._affine_prefill is None:
            self._affine_prefill = self._prefill_bases()
        if not self._affine_prefill:
            return None
        lo, hi, check, at_lo, at_hi = self._affine_prefill
        if tokens <= hi or tokens == check:
            return None
        return derive(at_lo, at_hi, Request(1, tokens, 0), lo, hi, tokens, outside_attention)

    def _prefill_bases(self) -> tuple:
        """(a, b, the checked count, the traces at a and b) that derive this model's prefill buckets beyond b, or ()
        when the derivation does not give the traced step at the checked count op for op. Routed experts start
        later: their routing ops change shape until a step's expert picks outnumber the experts."""
        def at(n: int):
            return self._trace(Request(1, n, 0))
        routed = any(op.experts is not None for op in at(2).ops)
        lo, hi = (64, 128) if routed else (2, 4)
        # a routed model is checked far out: at the memory probe's step when it is a bucket, else at 1024 tokens
        probes = [m for m, *_ in self._memory if m >= 1024 and m & (m - 1) == 0]
        check = (max(probes) if probes else 1024) if routed else 16
        at_lo, at_hi, checked = at(lo), at(hi), at(check)
        derived = derive(at_lo, at_hi, checked.request, lo, hi, check, outside_attention)
        if derived is None or derived.ops != [op for op in checked.ops if outside_attention(op)]:
            return ()
        # the attention kernels' launches, which a derived trace leaves out
        launches = [estimate(t, self.hw, self.execution, self.par, self.engine).num_kernels
                    for t in (at_hi, derive(at_lo, at_hi, at_hi.request, lo, hi, hi, outside_attention))]
        self._attention_kernels = launches[0] - launches[1]
        return lo, hi, check, at_lo, at_hi

    def logits(self, rows: float) -> float:
        """The output projection of `rows` rows beyond the one `linear` includes: a step computes the next-token
        logits of every sequence it samples (each decode, each prompt that completes; every verified position of a
        speculative step), not only of the last token."""
        if rows <= 1:
            return 0.0
        head = self._head
        if head is None:
            return 0.0
        run, op = head

        def rows_of(b: int) -> float:   # the traced one-row head GEMM with b rows: priced, not traced again
            t = self._logits.get(b)
            if t is None:
                act = op.bytes_read - op.weight_bytes
                wide = replace(op, gemm=replace(op.gemm, m=op.gemm.m * b), flops=op.flops * b,
                               bytes_read=op.weight_bytes + act * b, bytes_written=op.bytes_written * b)
                t = self._logits[b] = estimate(replace(run, ops=[wide]), self.hw, self.execution, self.par,
                                               self.engine).wall_s
            return t
        return max(0.0, _pow2_lerp(rows_of, rows) - rows_of(1))

    @cached_property
    def _head(self):
        """(a one-token trace, its output-projection op), or None for a model without one."""
        run = trace(self.spec, Request(1, 1, 0), self.options)
        op = next((o for o in run.ops if o.weight_role == "lm_head" and o.gemm is not None), None)
        return (run, op) if op is not None else None

    def _per_token_prefill(self, tokens_bucket: int, context_bucket: int, seqs_bucket: int = 1) -> float:
        key = (tokens_bucket, context_bucket, seqs_bucket)
        per_token = self._prefill.get(key)
        if per_token is None:
            per_token = self._prefill[key] = \
                self._attention_s(Request(seqs_bucket, tokens_bucket, context_bucket)) / (tokens_bucket * seqs_bucket)
        return per_token

    def prefill_attention(self, tokens: int, context: float, sequences: float = 1.0) -> float:
        """Attention of `sequences` chunks of `tokens` tokens over `context` earlier tokens each, in one call
        (engines batch a step's prompts into one varlen kernel, so its fixed cost is paid once): the per-token
        cost interpolated linearly in the context and in the sequence count between power-of-two shapes."""
        tb = _pow2_at_least(max(1, round(tokens)))

        def at_context(kb: int) -> float:
            key = (tb, context, kb)
            v = self._prefill_at.get(key)
            if v is None:
                v = self._prefill_at[key] = self._per_token_prefill(tb, 0, kb) if context <= 0 else \
                    _pow2_lerp(lambda cb: self._per_token_prefill(tb, cb, kb), context, lowest=0)
            return v

        return _pow2_lerp(at_context, max(1.0, sequences)) * tokens * sequences

    def decode_attention(self, batch: int, context: int, mixed: bool = False) -> float:
        """Decode attention per sequence, interpolated linearly in the context between power-of-two shapes;
        `mixed`: the rows share their step with a prompt chunk (mixed_decode_attention)."""
        if batch == 0:
            return 0.0
        bb = _pow2_at_least(batch)
        v = self._decode_at.get((bb, context, mixed))
        if v is None:
            v = self._decode_at[(bb, context, mixed)] = _pow2_lerp(lambda ctx: self._decode_per_seq(bb, ctx, mixed),
                                                                   max(1, context))
        return v * batch

    def _attention_s(self, request: Request, mixed: bool = False) -> float:
        """Attention seconds of a step of `request.num_queries` equal sequences (decode, or prefill chunks). The
        work is per sequence, so beyond two sequences it is derived from the traces of one and two
        (serving/derived_trace.py, exact to the FLOP) and priced, not traced again. `mixed`: decode rows of a
        step that also carries a prompt chunk (mixed_decode_attention)."""
        batch = request.num_queries
        if batch <= 2:
            return self._parts(request, mixed)[1]
        key = ("attention", batch, request.query_length, request.context_length, request.decode, mixed)
        seconds = self.shared.get(key) if self.shared is not None else None
        if seconds is None:
            one, two = (self._trace(replace(request, num_queries=b)) for b in (1, 2))
            derived = derive(one, two, request, 1, 2, batch, attention_work)
            if derived is None:
                return self._parts(request, mixed)[1]
            seconds = estimate(derived, self.hw, self.execution, self.par, self.engine,
                               mixed_step=mixed).breakdown_s["attention"]
            if self.shared is not None:
                self.shared[key] = seconds
        return seconds

    def _decode_per_seq(self, batch_bucket: int, context_bucket: int, mixed: bool = False) -> float:
        key = (batch_bucket, context_bucket, mixed)
        v = self._decode.get(key)
        if v is None:
            v = self._decode[key] = \
                self._attention_s(Request(batch_bucket, 1, context_bucket, decode=True), mixed) / batch_bucket
        return v

    @cached_property
    def mixes_decode_rows(self) -> bool:
        """Whether the engine runs a step's decode rows in its prefill kernel here when the step also carries a
        prompt chunk (cost/engine_kernels/calibration.py mixed_step_decodes: vLLM's FlashAttention backend)."""
        return self.execution == ENGINE and bool(self.hw.engine(self.engine).mixed_step_decodes)

    def mixed_decode_attention(self, batch: float, context: float) -> float:
        """Attention of `batch` decode rows (fractional: a mean) over `context` tokens each, in a step that also
        carries a prompt chunk: decode_attention where the engine runs them on its decode kernel in every step, else
        priced in its prefill kernel, a query tile per row (mixes_decode_rows)."""
        return _lerp(lambda b: self.decode_attention(b, round(context), self.mixes_decode_rows), batch)

    def decode_attention_from(self, batch: int, context: int, limit: int) -> np.ndarray:
        """decode_attention(batch, c) for c = context, context + 1, ... while c stays inside context's power-of-two
        bucket, at most `limit` values: the same numbers as one call per c (the bucket's two traced points, the
        same interpolation elementwise), for a run of decode steps whose context grows by one each step."""
        x = max(1, context)
        hi = _pow2_at_least(x)
        if x == hi or limit <= 1:        # a bucket point (or one value): priced as one call
            return np.array([self.decode_attention(batch, context)])
        lo, n, bb = hi // 2, min(limit, hi - x), _pow2_at_least(batch)
        f_lo = self._decode_per_seq(bb, lo)
        f_hi = self._decode_per_seq(bb, hi)
        xs = np.arange(x, x + n)
        return (f_lo + (f_hi - f_lo) * (xs - lo) / (hi - lo)) * batch

    def step(self, chunks: list[tuple[int, int]], decode_batch: int, decode_context: int) -> float:
        tokens = decode_batch
        if not chunks:
            attention = self.decode_attention(decode_batch, decode_context)
        else:          # one batched prefill call, at the chunks' mean length and context
            attention = self.mixed_decode_attention(decode_batch, decode_context)
            chunk_tokens = sum(t for t, _ in chunks)
            tokens += chunk_tokens
            attention += self.prefill_attention(chunk_tokens / len(chunks), sum(c for _, c in chunks) / len(chunks),
                                                len(chunks))
        kernels = self._staged(self.linear(tokens) + self.logits(decode_batch + len(chunks)) + attention, tokens)
        return kernels + self.beyond_kernels(decode_batch + len(chunks), tokens, kernels,
                                             decode_only=not chunks)

    def replica_memory(self, max_batched_tokens: int, memory_fraction: float | None = None,
                       max_num_seqs: int | None = None) -> ReplicaMemory:
        """Memory of one replica of this layout under the engine's budget (serving/capacity.py); activations
        from its largest step, `max_batched_tokens` tokens. `max_num_seqs` (the running cap the engine was
        launched with) changes only a speculative step's memory (serving/speculative.py); here it is unused."""
        o = self.overheads
        key = (max_batched_tokens, memory_fraction, o.reserve_gb, o.group_reserve_gb)
        mem = self._memory.get(key)
        if mem is None:
            probe = trace(self.spec, Request(1, max_batched_tokens, 0), self.options)
            mem = self._memory[key] = replica_memory(probe, self.hw, self.defaults, o.reserve_gb, self.par.tp,
                                                     self.par.pp, self.par.ep, memory_fraction, o.group_reserve_gb,
                                                     expert_resident(probe, self.engine, self.hw, self.execution))
        return mem

    def _sampling(self, rows: int) -> float:
        t = self._sampled.get(rows)
        if t is None:
            t = self._sampled[rows] = sampling_seconds(rows, self.vocab, self.hw, self.engine)
        return t

    @property
    def kernel_scale(self) -> float:
        """This release's kernels over the time the kernel fits give (cost/engines.py ServingOverheads.kernel_time)."""
        return self.overheads.kernel_time

    def _staged(self, kernels_s: float, tokens: float) -> float:
        """A step's kernels as a pipeline runs them: at the slowest stage's pace, plus the sends between stages."""
        kernels_s *= self.kernel_scale
        if self.par.pp == 1:
            return kernels_s
        return kernels_s * self.stage_factor + self.par.pp * self.stage_send_s(tokens)

    @property
    def stage_factor(self) -> float:
        """Pipeline stages run in lockstep at the pace of the slowest: with L layers over pp stages a stage holds
        ceil(L / pp), and each of the pp micro-batches in flight passes every stage once per step."""
        layers = max(1, self.num_layers)
        return self.par.pp * math.ceil(layers / self.par.pp) / layers

    def stage_send_s(self, tokens: int) -> float:
        """Hidden states of `tokens` tokens sent to the next stage (on the scale-out network when the replica spans
        more than one interconnect domain)."""
        cross = self.par.tp * self.par.pp > self.hw.scale_up_gpus
        return point_to_point_seconds(tokens * self.hidden * 2, self.hw, cross)

    def beyond_kernels(self, sequences: float, tokens: int, kernels_s: float, decode_only: bool,
                       host_in_series: bool = False) -> float:
        """What a step costs besides its kernels (`kernels_s`, seconds: a float, or an array of steps): sampling,
        the scheduler, rank sync, eager launches. `host_in_series`: the step runs where the engine does not schedule
        ahead though it would without speculating (serving/speculative.py SpeculativeStep.host_in_series)."""
        if self.execution != ENGINE or sequences <= 0:
            return 0.0
        o = self.overheads
        gpus = self.par.tp * self.par.pp * self.par.attention_dp
        per_seq_us = o.seq_us + (o.stream_us if self.streams else 0.0)
        host = (o.step_us + per_seq_us * sequences) * 1e-6
        if self.async_scheduling and not host_in_series:
            # scheduled while the GPU runs the step before: only what exceeds it shows
            host = np.maximum(host - kernels_s, 0.0)
        extra = host + o.gpu_sync_us * (gpus - 1) * 1e-6
        extra += _lerp(self._sampling, sequences)
        if decode_only and sequences > self.defaults.graph_max_batch:
            launches = self._launches.get(_pow2_at_least(max(1, tokens)))
            if launches is None:
                self.linear(tokens)
                launches = self._launches.get(_pow2_at_least(max(1, tokens)), 0)
            extra += np.maximum(launches * self.hw.kernel_launch_us * 1e-6 - kernels_s, 0.0)
        return extra

    def steady(self, decoding: float, prefill_tokens: float, chunk_tokens: int, chunk_context: float,
               decode_context: float, query: int = 1, draft_s: float = 0.0, host_in_series: bool = False) -> float:
        """A step of the steady-state model (serving/steady_state.py): `decoding` requests (fractional: a mean)
        each run `query` tokens, and `prefill_tokens` prompt tokens are prefilled as chunks of `chunk_tokens`
        over `chunk_context` earlier tokens each. A query above one is a speculative verification
        (serving/speculative.py): its attention is priced as a prefill chunk of that many tokens, never as that
        many decode steps, and every verified row is sampled; `draft_s` is the draft's forwards in the step;
        `host_in_series`: as beyond_kernels.
        Remembered per shape: a search's solves at neighbouring loads ask for the same steps (55% of the 26k a
        70B search asked were repeats)."""
        key = (decoding, prefill_tokens, chunk_tokens, chunk_context, decode_context, query, draft_s, host_in_series)
        t = self._steady.get(key)
        if t is None:
            if len(self._steady) >= STEADY_MEMO:
                self._steady.clear()
            t = self._steady[key] = self._steady_step(*key)
        return t

    def _steady_step(self, decoding: float, prefill_tokens: float, chunk_tokens: int, chunk_context: float,
                     decode_context: float, query: int, draft_s: float, host_in_series: bool = False) -> float:
        chunks = prefill_tokens / chunk_tokens if prefill_tokens > 0 else 0.0
        sequences = decoding + chunks
        tokens = decoding * query + prefill_tokens
        if not decoding:
            attention = 0.0
        elif query == 1:
            # a step in `chunks` carries a prompt chunk (at most one a step when chunks < 1): its decode rows are
            # priced beside it, the others alone
            mixed = min(1.0, chunks)
            alone = _lerp(lambda b: self.decode_attention(b, round(decode_context)), decoding)
            attention = alone if mixed <= 0 else \
                mixed * self.mixed_decode_attention(decoding, decode_context) + (1.0 - mixed) * alone
        else:
            attention = self.prefill_attention(query, decode_context, decoding)
        if prefill_tokens > 0:
            attention += self.prefill_attention(chunk_tokens, chunk_context, chunks)
        kernels = self._staged(_lerp(self.linear, tokens) + self.logits(decoding * query + chunks) + attention,
                               tokens) + draft_s * self.kernel_scale
        verified = self._sampling(decoding * query) - self._sampling(decoding) if query > 1 and decoding > 0 else 0.0
        return kernels + verified + self.beyond_kernels(sequences, math.ceil(tokens), kernels,
                                                        decode_only=prefill_tokens <= 0, host_in_series=host_in_series)


def _outside_attention(e) -> float:
    """Seconds of a forward beyond its attention kernels: engine steps sum the other classes (no subtraction, so a
    step priced from a derived trace without attention gives the same number); HF eager takes the wall clock less
    attention (its host launches may outlast the kernels)."""
    if e.host_s > 0:
        return e.wall_s - e.breakdown_s["attention"]
    return sum(seconds for kind, seconds in e.breakdown_s.items() if kind != "attention")


def _pow2_lerp(f, x: float, lowest: int = 1) -> float:
    """f at x, linear between the powers of two around it (below 1: between `lowest` and 1); f is only
    evaluated at those bucket points, so each is traced and priced once."""
    hi = _pow2_at_least(math.ceil(x))
    lo = hi // 2 if hi > 1 else lowest
    if lo == hi or x >= hi:
        return f(hi)
    f_lo = f(lo)
    return f_lo + (f(hi) - f_lo) * (x - lo) / (hi - lo)


def _lerp(f, x: float) -> float:
    """f at a fractional argument, linear between the integers around it."""
    lo = math.floor(x)
    base = f(lo)
    return base + (x - lo) * (f(lo + 1) - base) if x > lo else base
