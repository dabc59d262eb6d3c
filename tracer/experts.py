"""Routed experts through transformers' ExpertsInterface, priced with expected balanced routing.

Routing is data dependent and unknowable on meta. Each of the T x k (token, expert) pairs is
assumed to land uniformly: T*k/E tokens per expert (times an optional imbalance factor for the
busiest expert), and E * (1 - (1 - k/E)^T) distinct experts whose weights must be read.

The installed transformers' own grouped_mm experts path runs on meta, so its permute / mask /
activation / combine kernels are exactly the ones HF eager launches. Its grouped GEMMs are not
recorded as such: the recorder swaps them for ONE op per layer with the expected work above.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .recorder import active_recorder
from .work import GEMM, ExpertsWork, GemmShape

IMPLEMENTATION_NAME = "tracecost"


def expected_active_experts(tokens: int, num_experts: int, top_k: int) -> float:
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def experts_flops(w: ExpertsWork) -> float:
    return 2.0 * w.tokens * w.top_k * w.hidden_size * (w.up_width + w.intermediate_size)


def expert_weight_elements(w: ExpertsWork) -> int:
    return (w.up_width + w.intermediate_size) * w.hidden_size


def _dims(module) -> tuple[int, int, int, bool]:
    gated = getattr(module, "has_gate", True)
    up = module.gate_up_proj if gated else module.up_proj
    transposed = getattr(module, "is_transposed", False)
    hidden_size = up.shape[-2] if transposed else up.shape[-1]
    inter = module.down_proj.shape[-2] if transposed else module.down_proj.shape[-1]
    return up.shape[0], hidden_size, inter, gated


@dataclass
class PendingExperts:
    """The expected-work op the recorder emits in place of the first grouped GEMM of a layer."""
    work: ExpertsWork
    flops: float
    bytes_read: float
    bytes_written: float
    weight_bytes: float
    gemm: GemmShape
    recorded: bool = False


def pending_experts(rec, tokens: int, top_k: int, num_experts: int, hidden_size: int, inter: int, gated: bool,
                    act_bytes: int, weight_element: float) -> PendingExperts:
    """The expected work of one routed-experts layer over `tokens` tokens, each sent to `top_k` experts."""
    work = ExpertsWork(tokens=tokens, num_experts=num_experts, top_k=top_k, hidden_size=hidden_size,
                       intermediate_size=inter, gated=gated,
                       active_experts=expected_active_experts(tokens, num_experts, top_k), imbalance=rec.moe_imbalance)
    pairs, up_width = tokens * top_k, work.up_width
    weight_bytes = work.active_experts * expert_weight_elements(work) * weight_element
    return PendingExperts(
        work=work, flops=experts_flops(work),
        # the grouped GEMMs read the tokens and the activated intermediate, and write both outputs
        bytes_read=weight_bytes + pairs * (hidden_size + inter) * act_bytes,
        bytes_written=pairs * (up_width + hidden_size) * act_bytes, weight_bytes=weight_bytes,
        gemm=GemmShape(m=max(1, round(work.tokens_per_expert)), n=up_width + hidden_size, k=hidden_size,
                       batch=max(1, round(work.active_experts))))


def tracecost_experts(self, hidden_states, top_k_index, top_k_weights):
    from transformers.integrations.moe import grouped_mm_experts_forward
    rec = active_recorder()
    if rec is None:
        return grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    num_experts, hidden_size, inter, gated = _dims(self)
    rec.pending_experts = pending_experts(rec, hidden_states.shape[0], top_k_index.shape[-1], num_experts, hidden_size,
                                          inter, gated, hidden_states.element_size(), self.down_proj.element_size())
    try:
        return grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    finally:
        rec.pending_experts = None


def routed_llama4_moe(self, hidden_states):
    """Llama-4's MoE as a serving engine runs it: each token through its top-k experts (HF's eager path multiplies
    every token by every expert), plus the shared expert."""
    import torch
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    router_scores, router_logits = self.router(hidden_states)
    experts = self.experts
    out = hidden_states.new_empty(hidden_states.shape)
    rec = active_recorder()
    if rec is not None:
        num_experts, hidden_size, inter = experts.gate_up_proj.shape[0], experts.hidden_size, experts.expert_dim
        p = pending_experts(rec, hidden_states.shape[0], self.top_k, num_experts, hidden_size, inter, True,
                            hidden_states.element_size(), experts.down_proj.element_size())
        rec.record("tracecost.moe_experts", GEMM, "matrix", p.flops, [hidden_states, experts.gate_up_proj,
                                                                       experts.down_proj, router_scores], [out],
                   bytes_read=p.bytes_read, bytes_written=p.bytes_written, weight_bytes=p.weight_bytes,
                   experts=p.work, gemm=p.gemm)
    shared = self.shared_expert(hidden_states)
    return torch.add(shared, out), router_logits


def _record_routed(experts_module, hidden_states, top_k: int, num_experts: int, inter: int, gated: bool, weights):
    """One expected-work op for routed experts whose HF code dispatches tokens with data-dependent indexing."""
    out = hidden_states.new_empty(hidden_states.shape)
    rec = active_recorder()
    if rec is not None:
        p = pending_experts(rec, hidden_states.shape[0], top_k, num_experts, hidden_states.shape[-1], inter, gated,
                            hidden_states.element_size(), weights[0].element_size())
        rec.record("tracecost.moe_experts", GEMM, "matrix", p.flops, [hidden_states, *weights], [out],
                   bytes_read=p.bytes_read, bytes_written=p.bytes_written, weight_bytes=p.weight_bytes,
                   experts=p.work, gemm=p.gemm)
    return out


def routed_experts(self, hidden_states, top_k_index, top_k_weights, *args, **kwargs):
    """Experts with transformers' (hidden, top_k_index, top_k_weights) signature that loop over the hit experts
    (nonzero / where: data dependent, impossible on meta): one op with the expected routed work."""
    gate_up = getattr(self, "gate_up_proj", None)
    up = gate_up if gate_up is not None else self.up_proj
    hidden = hidden_states.shape[-1]
    width = up.shape[-2] if up.shape[-1] == hidden else up.shape[-1]
    gated = gate_up is not None
    return _record_routed(self, hidden_states, top_k_index.shape[-1], self.down_proj.shape[0],
                          width // 2 if gated else width, gated, [up, self.down_proj])


def routed_aria_experts(self, hidden_states, router_logits, *args, **kwargs):
    """Aria's grouped-GEMM experts (sequential per-expert loops in HF): router top-k, then one routed op. Later
    transformers releases pass (hidden, top_k_index, top_k_weights) instead of the router logits, and later still
    store the experts as gate_up_proj / down_proj."""
    if not hasattr(self, "fc1"):
        return routed_experts(self, hidden_states, router_logits, *args, **kwargs)
    if router_logits.is_floating_point():
        top_k_index, _ = self.route_tokens_to_experts(router_logits)
    else:
        top_k_index = router_logits
    weight = self.fc1.weight   # [E, hidden, 2 x inter]
    return _record_routed(self, hidden_states, top_k_index.shape[-1], weight.shape[0], weight.shape[-1] // 2, True,
                          [weight, self.fc2.weight])


def wants_routed_forward(module) -> bool:
    """Experts tensors with the (hidden, top_k_index, top_k_weights) forward but not routed through ExpertsInterface."""
    import inspect
    down = getattr(module, "down_proj", None)
    if hasattr(module, "has_gate") or not (isinstance(down, torch.Tensor) and down.dim() == 3):
        return False
    params = list(inspect.signature(type(module).forward).parameters)
    return len(params) >= 4 and params[2] == "top_k_index"


def routed_dbrx_experts(self, hidden_states, top_k_index, top_k_weights, *args, **kwargs):
    """DBRX: experts stacked as [E x ffn, hidden] matrices w1, v1 (gate, up) and w2 (down)."""
    flat = hidden_states.reshape(-1, self.hidden_size)
    out = _record_routed(self, flat, top_k_index.shape[-1], self.num_experts, self.ffn_hidden_size, True,
                         [self.mlp.w1, self.mlp.v1, self.mlp.w2])
    return out.reshape(hidden_states.shape)


def balanced_jetmoe_gating(self, hidden_states):
    """JetMoE's router (expert sizes via .tolist() in HF: data dependent): the router GEMM and top-k, then the
    T x k (token, expert) pairs split evenly over the experts."""
    logits = self.layer(hidden_states).float()
    top_k_logits, _ = logits.topk(self.top_k, dim=1)
    pairs = hidden_states.shape[0] * self.top_k
    sizes = [pairs // self.num_experts + (1 if e < pairs % self.num_experts else 0) for e in range(self.num_experts)]
    index = top_k_logits.new_empty(pairs, dtype=torch.long)
    gates = top_k_logits.new_empty(pairs, dtype=hidden_states.dtype)
    return index, index, gates, sizes, logits


def routed_parallel_experts(self, inputs, expert_size):
    """JetMoE's per-expert GEMMs over the routed rows, as one grouped GEMM of the expected work."""
    rows, (experts, out_width, in_width) = inputs.shape[0], self.weight.shape
    out = inputs.new_empty(rows, out_width)
    rec = active_recorder()
    if rec is not None:
        top_k = getattr(self, "top_k", 1)
        tokens = max(1, rows // top_k)
        active = expected_active_experts(tokens, experts, top_k)
        weight_bytes = active * out_width * in_width * self.weight.element_size()
        act = inputs.element_size()
        rec.record("tracecost.moe_experts", GEMM, "matrix", 2.0 * rows * in_width * out_width, [inputs, self.weight],
                   [out], bytes_read=weight_bytes + rows * in_width * act, bytes_written=rows * out_width * act,
                   weight_bytes=weight_bytes,
                   gemm=GemmShape(m=max(1, round(rows / experts)), n=out_width, k=in_width, batch=max(1, round(active))))
        rec.mark_expert_weight(self.weight, top_k, experts)
    return out


def prepare_jetmoe(module) -> None:
    """The parallel experts of a JetMoE MoE / MoA block learn their routing's top-k."""
    for child in (module.input_linear, module.output_linear):
        child.top_k = module.top_k if hasattr(module, "top_k") else module.router.top_k


# Module classes whose MoE forward is replaced by a routed one
ROUTED_FORWARDS = {"Llama4TextMoe": routed_llama4_moe, "AriaExperts": routed_aria_experts,
                   "DbrxExperts": routed_dbrx_experts, "JetMoeTopKGating": balanced_jetmoe_gating,
                   "JetMoeParallelExperts": routed_parallel_experts}


def register() -> None:
    from transformers.integrations.moe import ExpertsInterface
    ExpertsInterface.register(IMPLEMENTATION_NAME, tracecost_experts)
