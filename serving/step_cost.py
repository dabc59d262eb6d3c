"""Time of one engine step, from the tracer and cost model.

A step runs the decode tokens of every running request plus prefill chunks (chunked prefill). Its time is
the non-attention work of all the step's tokens, the attention of each prefill chunk over its context, and
the decode attention. Shapes are bucketed to powers of two and interpolated, so a long simulation traces
only a few dozen distinct shapes. Recomputing a preempted request is a prefill like any other.
"""
from __future__ import annotations

import math

from cost.estimate import Parallelism, estimate
from cost.profile import HardwareProfile
from tracer.model_source import ModelSpec
from tracer.trace import trace
from tracer.work import Request, TraceOptions


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


class StepCost:
    def __init__(self, spec: ModelSpec, hw: HardwareProfile, options: TraceOptions, execution: str, tp: int):
        self.spec, self.hw, self.options, self.execution, self.tp = spec, hw, options, execution, tp
        self._cache: dict = {}
        self._linear: dict = {}

    def _parts(self, request: Request) -> tuple[float, float]:
        """(seconds without attention, attention seconds) of one forward."""
        if request not in self._cache:
            e = estimate(trace(self.spec, request, self.options), self.hw, self.execution, Parallelism(self.tp))
            attention = e.breakdown_s["attention"]
            self._cache[request] = (e.wall_s - attention, attention)
        return self._cache[request]

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
