"""Time of one engine step, from the tracer and cost model.

A step runs the decode tokens of every running request plus prefill chunks (chunked prefill). Its time is
the non-attention work of all the step's tokens, the attention of each prefill chunk over its context, and
the decode attention. Shapes are bucketed to powers of two and interpolated, so a long simulation traces
only a few dozen distinct shapes. Recomputing a preempted request is a prefill like any other.
"""
from __future__ import annotations

from cost.estimate import Parallelism, estimate
from cost.profile import HardwareProfile
from tracer.model_source import ModelSpec
from tracer.trace import trace
from tracer.work import Request, TraceOptions


def _pow2_at_least(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 1 else 1


class StepCost:
    def __init__(self, spec: ModelSpec, hw: HardwareProfile, options: TraceOptions, execution: str, tp: int,
                 engine: str = "vllm"):
        self.spec, self.hw, self.options, self.execution, self.tp = spec, hw, options, execution, tp
        self.engine = engine
        self._cache: dict = {}
        self._linear: dict = {}
        self._prefill: dict = {}     # (token bucket, context bucket) -> attention seconds per token
        self._decode: dict = {}      # (batch bucket, context bucket) -> attention seconds per sequence
        self.shared = None           # a mapping shared by processes running a sweep: each shape traced once

    def _parts(self, request: Request) -> tuple[float, float]:
        """(seconds without attention, attention seconds) of one forward."""
        parts = self._cache.get(request)
        if parts is None:
            key = (request.num_queries, request.query_length, request.context_length, request.decode)
            parts = self.shared.get(key) if self.shared is not None else None
            if parts is None:
                e = estimate(trace(self.spec, request, self.options), self.hw, self.execution, Parallelism(self.tp),
                             self.engine)
                attention = e.breakdown_s["attention"]
                parts = (e.wall_s - attention, attention)
                if self.shared is not None:
                    self.shared[key] = parts
            self._cache[request] = parts
        return parts

    def linear(self, tokens: int) -> float:
        """Everything but attention for a step of `tokens` tokens, interpolated between power-of-two shapes."""
        if tokens <= 0:
            return 0.0
        t = self._linear.get(tokens)
        if t is None:
            hi = _pow2_at_least(tokens)
            lo = max(1, hi // 2)
            t_hi = self._parts(Request(1, hi, 0))[0]
            if hi == lo or tokens == hi:
                t = t_hi
            else:
                t_lo = self._parts(Request(1, lo, 0))[0]
                t = t_lo + (t_hi - t_lo) * (tokens - lo) / (hi - lo)
            self._linear[tokens] = t
        return t

    def prefill_attention(self, tokens: int, context: int) -> float:
        key = (_pow2_at_least(tokens), _pow2_at_least(context) if context else 0)
        per_token = self._prefill.get(key)
        if per_token is None:
            per_token = self._prefill[key] = self._parts(Request(1, key[0], key[1]))[1] / key[0]
        return per_token * tokens

    def decode_attention(self, batch: int, context: int) -> float:
        if batch == 0:
            return 0.0
        key = (_pow2_at_least(batch), _pow2_at_least(max(1, context)))
        per_seq = self._decode.get(key)
        if per_seq is None:
            per_seq = self._decode[key] = self._parts(Request(key[0], 1, key[1], decode=True))[1] / key[0]
        return per_seq * batch

    def step(self, chunks: list[tuple[int, int]], decode_batch: int, decode_context: int) -> float:
        tokens, attention = decode_batch, self.decode_attention(decode_batch, decode_context)
        for t, c in chunks:
            tokens += t
            attention += self.prefill_attention(t, c)
        return self.linear(tokens) + attention
