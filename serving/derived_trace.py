"""A step's trace at another size, derived from two traced sizes where its work is exactly affine in that size.

A search prices one model at dozens of step shapes that differ in one count: the sequences of a decode step, the
tokens of a prefill step. Most ops' work is exactly affine in that count (a GEMM's rows, a norm's elements, the
keys a decode attention reads per sequence times the sequences), so two traces at counts a and b give every
field at any count x as f(a) + (f(b) - f(a)) (x - a) / (b - a): integers stay integers, FLOPs and bytes stay
the exact values a trace would record (they are integer-valued or dyadic floats). Two traces cannot show that a
field is affine, so a caller derives only along an axis where the work is affine by construction (the sequences
of a step: each attends its own cache) or checks the derivation against a third trace (a dense model's prefill
tokens: serving/step_cost.py checks against the traced 16-token step). Fields that are not affine (routed experts'
expected active count, a causal prefill's query-key pairs) stay with real traces; `derive` returns None when the
two traces differ in structure or an integer field would not be an integer.
tests/test_derived_trace.py compares derived traces with real ones to the last FLOP and byte.
"""
from __future__ import annotations

import dataclasses
from dataclasses import replace

from tracer.work import ATTENTION, Op, Request, Trace


class NotAffine(Exception):
    """A field that differs between the two traces in a way no affine rule carries to other counts."""


def _affine(a, b, t: tuple[int, int, int]):
    """The value at count x of a field worth `a` at count xa and `b` at count xb; t = (xa, xb, x)."""
    if a == b:
        return a
    xa, xb, x = t
    if type(a) is not type(b) or isinstance(a, (bool, str)) or a is None or b is None:
        raise NotAffine
    if isinstance(a, int):
        step, rest = divmod((b - a) * (x - xa), xb - xa)
        if rest:
            raise NotAffine
        return a + step
    if isinstance(a, float):
        return a + (b - a) * ((x - xa) / (xb - xa))
    if isinstance(a, tuple):
        if len(a) != len(b):
            raise NotAffine
        return tuple(_affine(u, v, t) for u, v in zip(a, b))
    if dataclasses.is_dataclass(a):
        return replace(a, **{f.name: _affine(getattr(a, f.name), getattr(b, f.name), t)
                             for f in dataclasses.fields(a) if getattr(a, f.name) != getattr(b, f.name)})
    raise NotAffine


def attention_work(op: Op) -> bool:
    """The ops an engine's attention kernel runs: the attention core and the KV-cache write it performs."""
    return op.op_class == ATTENTION or op.kv_cache_write


def outside_attention(op: Op) -> bool:
    """Every other op: GEMMs, norms, activations, routing; their work grows with the tokens, not the context."""
    return not attention_work(op)


def _source_unused(a: Op, b: Op) -> bool:
    """`source` (the index of the op that produced the first input) only lets GEMMs that read one input merge;
    a subset of a trace whose op list grows with the count (routing ops from two tokens on) sees it move, and
    takes the larger count's."""
    return a.source != b.source and a.gemm is None and b.gemm is None


def _experts_base(op: Op) -> Op:
    """A routed-experts op without the parts that follow from its expected active experts (not affine)."""
    return replace(op, weight_bytes=0.0, bytes_read=op.bytes_read - op.weight_bytes,
                   experts=replace(op.experts, active_experts=0.0), gemm=replace(op.gemm, m=0, batch=0))


def _experts_at(base: Op, at_b: Op) -> Op:
    """The parts a derived routed-experts op takes from its tokens: the expected active experts
    E (1 - (1 - k/E)^n) (tracer/experts.py), the expert weights read (in proportion to them, as at count b), the
    grouped GEMM's rows per expert and its experts."""
    from tracer.experts import expected_active_experts   # (imports torch: only when a trace is derived)
    work = replace(base.experts, active_experts=expected_active_experts(base.experts.tokens, base.experts.num_experts,
                                                                        base.experts.top_k))
    weights = at_b.weight_bytes / at_b.experts.active_experts * work.active_experts
    return replace(base, experts=work, weight_bytes=weights, bytes_read=base.bytes_read + weights,
                   gemm=replace(base.gemm, m=max(1, round(work.tokens_per_expert)),
                                batch=max(1, round(work.active_experts))))


def _derive_op(a: Op, b: Op, t: tuple[int, int, int]) -> Op:
    if _source_unused(a, b):
        a = replace(a, source=b.source)
    if a.experts is not None and b.experts is not None and a.gemm is not None and b.gemm is not None:
        return _experts_at(_affine(_experts_base(a), _experts_base(b), t), b)
    return _affine(a, b, t)


def derive(at_a: Trace, at_b: Trace, request: Request, count_a: int, count_b: int, count: int,
           keep=None) -> Trace | None:
    """The trace of `request` (whose count is `count`) from traces at counts `count_a` and `count_b` of the same
    model, options and shape otherwise; only the ops `keep` selects (all by default). None: not derivable."""
    ops_a = [op for op in at_a.ops if keep is None or keep(op)]
    ops_b = [op for op in at_b.ops if keep is None or keep(op)]
    if len(ops_a) != len(ops_b):
        return None
    t = (count_a, count_b, count)
    try:
        ops = [_derive_op(a, b, t) for a, b in zip(ops_a, ops_b)]
    except NotAffine:
        return None
    return replace(at_a, request=request, ops=ops, trace_seconds=0.0)


__all__ = ["attention_work", "derive", "outside_attention"]
