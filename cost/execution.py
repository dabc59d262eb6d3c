"""From traced ops to the kernels an executor launches: HF eager (one kernel per op) or a serving engine.

Engine execution (vLLM / SGLang / TensorRT-LLM): one GEMM for q/k/v and for gate/up (GEMMs that read
the same input with the same K merge), flash attention for every prefill including over a cached
prefix, and the norm / rotary / activation / residual / cast ops of a layer fused into one kernel
each, priced by the bytes that cross the fused kernel's boundary.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from tracer.attention import attention_bytes, attention_flops
from tracer.work import ATTENTION, GEMM, OTHER, GemmShape, Op, Trace

ENGINE, EAGER = "engine", "eager"
EXECUTIONS = (ENGINE, EAGER)


@dataclass(frozen=True)
class Kernel:
    name: str
    op_class: str            # gemm | attention | other | communication
    module: str
    flops: float
    bytes: float
    dtype: str
    count: int
    gemm: GemmShape | None = None
    op: Op | None = None     # the traced op (first one for merged or fused kernels)
    masked: bool = False     # attention over a cached prefix through an explicit-bias kernel
    ops: int = 1             # traced ops this kernel stands for
    broadcast: bool = False  # unfused elementwise kernel with a broadcast input


def _shard_op(op: Op, tp: int, ep: int, act_bytes: int, kv_bytes: float) -> Op:
    """The part of an op one rank runs under tensor (and expert) parallelism."""
    if op.experts is not None:
        ways = ep if ep > 1 else tp
        if ways == 1:
            return op
        w = op.experts
        # EP gives each rank 1/ep of the experts, whole; TP gives each rank a 1/tp slice of every expert
        experts = (replace(w, active_experts=w.active_experts / ep) if ep > 1
                   else replace(w, intermediate_size=max(1, w.intermediate_size // tp)))
        return replace(op, experts=experts, flops=op.flops / ways, bytes_read=op.bytes_read / ways,
                       bytes_written=op.bytes_written / ways, weight_bytes=op.weight_bytes / ways)
    if tp == 1 or not op.tp_sharded:
        return op
    if op.attention is not None:
        w = op.attention
        sharded = replace(w, heads=-(-w.heads // tp), kv_heads=-(-w.kv_heads // tp))  # uneven splits: the busiest rank
        read, written = attention_bytes(sharded, act_bytes, kv_bytes)
        return replace(op, attention=sharded, flops=attention_flops(sharded), bytes_read=read, bytes_written=written)
    gemm = op.gemm
    if gemm is not None:
        gemm = replace(gemm, n=max(1, gemm.n // tp))
    return replace(op, gemm=gemm, flops=op.flops / tp, bytes_read=op.bytes_read / tp,
                   bytes_written=op.bytes_written / tp, weight_bytes=op.weight_bytes / tp,
                   fused_bytes=None if op.fused_bytes is None else op.fused_bytes / tp)


def _eager_kernels(ops: list[Op], masked_attention: bool) -> list[Kernel]:
    return [Kernel(name=op.name, op_class=op.op_class, module=op.module, flops=op.flops, bytes=op.bytes, dtype=op.dtype,
                   count=op.count, gemm=op.gemm, op=op, masked=masked_attention and op.attention is not None,
                   broadcast=op.broadcast)
            for op in ops]


def _mergeable_gemm(kernels: list[Kernel], op: Op, lookback: int = 4) -> int | None:
    """Index of a recent GEMM that reads the same input with the same M and K (q/k/v, gate/up): one kernel."""
    if op.op_class != GEMM or op.gemm is None or op.experts is not None or op.source is None:
        return None
    for j in range(len(kernels) - 1, max(-1, len(kernels) - 1 - lookback), -1):
        k = kernels[j]
        if (k.op_class == GEMM and k.op is not None and k.op.experts is None and k.gemm is not None
                and k.op.source == op.source and k.gemm.k == op.gemm.k and k.gemm.m == op.gemm.m
                and k.count == op.count and k.op.layer == op.layer):
            return j
    return None


def _engine_kernels(ops: list[Op]) -> list[Kernel]:
    kernels: list[Kernel] = []
    fused_at: dict[str, int] = {}  # fusion key -> index of its kernel; members need not be adjacent
    for op in ops:
        if op.op_class == OTHER and op.fusion_key is not None:
            if op.fusion_key in fused_at:
                j = fused_at[op.fusion_key]
                kernels[j] = replace(kernels[j], flops=kernels[j].flops + op.flops, ops=kernels[j].ops + 1)
                continue
            fused_at[op.fusion_key] = len(kernels)
            kernels.append(Kernel(name="fused", op_class=OTHER, module=op.module, flops=op.flops,
                                  bytes=op.fused_bytes if op.fused_bytes is not None else op.bytes, dtype=op.dtype,
                                  count=op.count, op=op, ops=1))
            continue
        j = _mergeable_gemm(kernels, op)
        if j is not None:
            prev = kernels[j]
            shared_input = op.gemm.m * op.gemm.k * (op.bytes_written / max(1, op.gemm.m * op.gemm.n))
            kernels[j] = replace(prev, name="merged_gemm", flops=prev.flops + op.flops,
                                 bytes=prev.bytes + op.bytes - shared_input,
                                 gemm=replace(prev.gemm, n=prev.gemm.n + op.gemm.n), ops=prev.ops + 1)
            continue
        kernels.append(Kernel(name=op.name, op_class=op.op_class, module=op.module, flops=op.flops, bytes=op.bytes,
                              dtype=op.dtype, count=op.count, gemm=op.gemm, op=op))
    return kernels


def build_kernels(trace: Trace, execution: str, tp: int = 1, ep: int = 1, act_bytes: int = 2) -> list[Kernel]:
    if execution not in EXECUTIONS:
        raise ValueError(f"unknown execution '{execution}' (choose from {', '.join(EXECUTIONS)})")
    kv_bytes = trace.kv_element_size
    ops = [_shard_op(op, tp, ep, act_bytes, kv_bytes) for op in trace.ops]
    if execution == EAGER:
        request = trace.request
        return _eager_kernels(ops, masked_attention=request.context_length > 0 and request.query_length > 1)
    return _engine_kernels(ops)


__all__ = ["ATTENTION", "EAGER", "ENGINE", "EXECUTIONS", "GEMM", "Kernel", "OTHER", "build_kernels"]
