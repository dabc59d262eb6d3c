"""From traced ops to the kernels an executor launches: HF eager (one kernel per op) or a serving engine.

Engine execution (vLLM / SGLang / TensorRT-LLM): one GEMM for q/k/v and for gate/up (GEMMs that read
the same input with the same K merge), paged flash attention for every prefill including over a cached
prefix, writing the new K/V into the cache itself (no separate KV-write kernel), one fused-MoE layer
per routed-experts block (routing, permutation, grouped GEMMs, activation and combine in one call), and
the norm / rotary / activation / residual / cast ops of a layer fused into one kernel each, priced by
the bytes that cross the fused kernel's boundary.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from tracer.attention import attention_bytes, attention_flops
from tracer.work import ATTENTION, GEMM, OTHER, GemmShape, Op, Trace

ENGINE, EAGER = "engine", "eager"
EXECUTIONS = (ENGINE, EAGER)
# expert parallelism: vLLM's default sends every token through every rank's routing and permutation and
# all-reduces the partial outputs; dispatch-style EP (DeepEP) sends each rank only its pairs by all-to-all
EP_ALL_TOKENS, EP_DISPATCH = "all-tokens", "dispatch"
EP_STYLES = (EP_ALL_TOKENS, EP_DISPATCH)
# GEMMs every rank runs whole: MLA's low-rank down projections (vLLM's fused_qkv_a_proj with disable_tp, SGLang's
# and TensorRT-LLM's replicated kv_a_proj_with_mqa), narrow enough that splitting them would cost more in
# communication than it saves; and the MoE router, whose full scores every rank needs to pick its experts
REPLICATED_MODULES = frozenset({"q_a_proj", "kv_a_proj_with_mqa"})


def replicated(op: Op) -> bool:
    """Whether every tensor-parallel rank runs this GEMM whole."""
    return op.gemm is not None and (op.weight_role == "router"
                                    or op.module.rsplit(".", 1)[-1] in REPLICATED_MODULES)


@dataclass(frozen=True)
class MoeCall:
    """One rank's fused-MoE layer: `tokens` reach its routing; it holds experts / ep experts, inter / tp of each."""
    tokens: int
    hidden: int
    inter: int
    experts: int
    top_k: int
    gated: bool
    tp: int
    ep: int
    style: str
    imbalance: float = 1.0     # tokens on the busiest expert over a balanced share (--moe-imbalance)


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
    moe: MoeCall | None = None  # engine execution: the fused-MoE layer this kernel is


def expert_slots(experts: int, ep: int) -> int:
    """Expert copies an EP group of `ep` ranks holds. When `ep` divides the experts, the experts themselves; else
    the engine rounds them up to a whole number per rank by replicating the busiest experts (EPLB: TensorRT-LLM's
    MoeLoadBalancer num_slots, vLLM --enable-eplb --num-redundant-experts): each rank holds ceil(E / ep) experts
    and, balanced, 1/ep of the (token, expert) pairs."""
    if ep <= 1 or experts % ep == 0:
        return experts
    return -(-experts // ep) * ep


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
        held = expert_slots(w.num_experts, ep) / w.num_experts if ep > 1 else 1.0   # redundant slots' weights
        return replace(op, experts=experts, flops=op.flops / ways, bytes_read=op.bytes_read / ways,
                       bytes_written=op.bytes_written / ways, weight_bytes=op.weight_bytes * held / ways)
    if tp == 1 or not op.tp_sharded or replicated(op):
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
                and k.count == op.count and k.op.layer == op.layer
                and (k.op.weight_format, k.op.weight_role) == (op.weight_format, op.weight_role)):
            return j
    return None


def _moe_blocks(ops: list[Op]) -> dict[str, str]:
    """experts module -> its MoE block (the module holding the router and the experts)."""
    return {op.module: op.module.rsplit(".", 1)[0] for op in ops if op.experts is not None}


def _fused_moe_block(op: Op, blocks: dict[str, str]) -> str | None:
    """The MoE block whose fused layer performs this routing / permutation / activation / combine op, if any."""
    if op.op_class != OTHER:
        return None
    for experts, block in blocks.items():
        if op.module.startswith(experts) or op.module == block or \
                (op.module.startswith(block + ".") and "shared" not in op.module):
            return block
    return None


def _moe_call(op: Op, tp: int, ep: int, style: str, attention_dp: int = 1) -> MoeCall:
    """Under attention data parallelism the experts of a rank serve the tokens of every DP rank."""
    w = op.experts
    tokens = w.tokens * attention_dp
    tokens = tokens if style == EP_ALL_TOKENS else max(1, round(tokens * w.top_k / ep))
    return MoeCall(tokens=tokens, hidden=w.hidden_size, inter=w.intermediate_size, experts=expert_slots(w.num_experts, ep),
                   top_k=w.top_k if style == EP_ALL_TOKENS else 1, gated=w.gated, tp=max(1, tp // ep) if ep > 1 else tp, ep=ep,
                   style=style, imbalance=w.imbalance)


def _engine_kernels(ops: list[Op], tp: int = 1, ep: int = 1, ep_style: str = EP_ALL_TOKENS,
                    attention_dp: int = 1) -> list[Kernel]:
    kernels: list[Kernel] = []
    fused_at: dict[str, int] = {}  # fusion key -> index of its kernel; members need not be adjacent
    blocks = _moe_blocks(ops)
    # ops an engine kernel performs itself: the attention kernel writes the cache, the fused-MoE layer
    # routes, permutes and combines; their work joins that kernel (counted once, never dropped)
    absorbed: dict[tuple, list[Op]] = {}
    for op in ops:
        block = _fused_moe_block(op, blocks)
        if op.kv_cache_write or block is not None:
            key = ("moe", block) if block is not None else ("attention", op.layer, op.module)
            absorbed.setdefault(key, []).append(op)
            continue
        if op.experts is not None:
            kernels.append(Kernel(name="fused_moe", op_class=GEMM, module=op.module, flops=op.flops, bytes=op.bytes,
                                  dtype=op.dtype, count=op.count, op=op, moe=_moe_call(op, tp, ep, ep_style, attention_dp)))
            continue
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
    for i, k in enumerate(kernels):
        key = (("moe", blocks[k.module]) if k.moe is not None
               else ("attention", k.op.layer, k.op.module) if k.op is not None and k.op.attention is not None else None)
        if key in absorbed:
            extra = absorbed.pop(key)
            kernels[i] = replace(k, flops=k.flops + sum(o.flops for o in extra), ops=k.ops + len(extra))
    for leftover in absorbed.values():  # no kernel to join (an unusual module layout): keep them as they are
        kernels += [Kernel(name=o.name, op_class=o.op_class, module=o.module, flops=o.flops, bytes=o.bytes,
                           dtype=o.dtype, count=o.count, op=o) for o in leftover]
    return kernels


def build_kernels(trace: Trace, execution: str, tp: int = 1, ep: int = 1, act_bytes: int = 2,
                  ep_style: str = EP_ALL_TOKENS, attention_dp: int = 1) -> list[Kernel]:
    if execution not in EXECUTIONS:
        raise ValueError(f"unknown execution '{execution}' (choose from {', '.join(EXECUTIONS)})")
    if ep_style not in EP_STYLES:
        raise ValueError(f"unknown expert-parallel style '{ep_style}' (choose from {', '.join(EP_STYLES)})")
    kv_bytes = trace.kv_element_size
    if execution == EAGER:
        if attention_dp > 1:
            raise ValueError("attention data parallelism is priced for engine execution only")
        ops = [_shard_op(op, tp, ep, act_bytes, kv_bytes) for op in trace.ops]
        request = trace.request
        return _eager_kernels(ops, masked_attention=request.context_length > 0 and request.query_length > 1)
    # the fused-MoE kernel model takes the global expert shape and the layout itself
    ops = [op if op.experts is not None else _shard_op(op, tp, ep, act_bytes, kv_bytes) for op in trace.ops]
    return _engine_kernels(ops, tp, ep, ep_style, attention_dp)


__all__ = ["ATTENTION", "EAGER", "ENGINE", "EP_ALL_TOKENS", "EP_DISPATCH", "EP_STYLES", "EXECUTIONS", "GEMM", "Kernel",
           "MoeCall", "OTHER", "REPLICATED_MODULES", "build_kernels", "expert_slots", "replicated"]
