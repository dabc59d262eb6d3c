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

from .recorder import active_recorder
from .work import ExpertsWork, GemmShape

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


def tracecost_experts(self, hidden_states, top_k_index, top_k_weights):
    from transformers.integrations.moe import grouped_mm_experts_forward
    rec = active_recorder()
    if rec is None:
        return grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    tokens, top_k = hidden_states.shape[0], top_k_index.shape[-1]
    num_experts, hidden_size, inter, gated = _dims(self)
    work = ExpertsWork(tokens=tokens, num_experts=num_experts, top_k=top_k, hidden_size=hidden_size,
                       intermediate_size=inter, gated=gated,
                       active_experts=expected_active_experts(tokens, num_experts, top_k), imbalance=rec.moe_imbalance)
    pairs, act = tokens * top_k, hidden_states.element_size()
    up_width = work.up_width
    weight_bytes = work.active_experts * expert_weight_elements(work) * self.down_proj.element_size()
    rec.pending_experts = PendingExperts(
        work=work, flops=experts_flops(work),
        # the grouped GEMMs read the tokens and the activated intermediate, and write both outputs
        bytes_read=weight_bytes + pairs * (hidden_size + inter) * act,
        bytes_written=pairs * (up_width + hidden_size) * act, weight_bytes=weight_bytes,
        gemm=GemmShape(m=max(1, round(work.tokens_per_expert)), n=up_width + hidden_size, k=hidden_size,
                       batch=max(1, round(work.active_experts))))
    try:
        return grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    finally:
        rec.pending_experts = None


def register() -> None:
    from transformers.integrations.moe import ExpertsInterface
    ExpertsInterface.register(IMPLEMENTATION_NAME, tracecost_experts)
