"""Routed experts through transformers' ExpertsInterface, priced with expected balanced routing.

Routing is data dependent and unknowable on meta. Each of the T x k (token, expert) pairs is
assumed to land uniformly: T*k/E tokens per expert (times an optional imbalance factor for the
busiest expert), and E * (1 - (1 - k/E)^T) distinct experts whose weights must be read.
The expert GEMMs are one op; the permute / activation / combine around them run as real ops so
eager execution sees the same auxiliary kernels HF's grouped_mm path launches.
"""
from __future__ import annotations

import torch

from .recorder import active_recorder
from .work import GEMM, MATRIX, ExpertsWork, GemmShape

IMPLEMENTATION_NAME = "tracecost"


def expected_active_experts(tokens: int, num_experts: int, top_k: int) -> float:
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def experts_flops(w: ExpertsWork) -> float:
    up_width = (2 if w.gated else 1) * w.intermediate_size
    return 2.0 * w.tokens * w.top_k * w.hidden_size * (up_width + w.intermediate_size)


def expert_weight_elements(w: ExpertsWork) -> int:
    return ((2 if w.gated else 1) * w.intermediate_size + w.intermediate_size) * w.hidden_size


def _dims(module) -> tuple[int, int, int, bool]:
    gated = getattr(module, "has_gate", True)
    up = module.gate_up_proj if gated else module.up_proj
    num_experts = up.shape[0]
    down = module.down_proj  # [E, hidden, inter] or transposed [E, inter, hidden]
    hidden_size = up.shape[-1] if not getattr(module, "is_transposed", False) else up.shape[-2]
    inter = down.shape[-1] if not getattr(module, "is_transposed", False) else down.shape[-2]
    return num_experts, hidden_size, inter, gated


def tracecost_experts(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
    rec = active_recorder()
    tokens, top_k = hidden_states.shape[0], top_k_index.shape[-1]
    num_experts, hidden_size, inter, gated = _dims(self)
    imbalance = rec.moe_imbalance if rec is not None else 1.0
    work = ExpertsWork(tokens=tokens, num_experts=num_experts, top_k=top_k, hidden_size=hidden_size,
                       intermediate_size=inter, gated=gated,
                       active_experts=expected_active_experts(tokens, num_experts, top_k), imbalance=imbalance)
    pairs = tokens * top_k

    # permute: sort (token, expert) pairs by expert and gather their hidden states
    expert_ids = top_k_index.reshape(-1)
    _, perm = torch.sort(expert_ids)
    gathered = hidden_states[perm // top_k]

    up_width = (2 if gated else 1) * inter
    up_out = gathered.new_empty(pairs, up_width)
    down_out = gathered.new_empty(pairs, hidden_size)
    if rec is not None:
        weight_bytes = work.active_experts * expert_weight_elements(work) * self.down_proj.element_size()
        act = gathered.element_size()
        # the grouped GEMMs read tokens and the activated intermediate, and write both their outputs
        rec.record("tracecost.moe_experts", GEMM, MATRIX, experts_flops(work), [gathered], [down_out],
                   bytes_read=weight_bytes + pairs * (hidden_size + inter) * act,
                   bytes_written=pairs * (up_width + hidden_size) * act, weight_bytes=weight_bytes,
                   experts=work,
                   gemm=GemmShape(m=max(1, round(work.tokens_per_expert)), n=up_width + hidden_size,
                                  k=hidden_size, batch=max(1, round(work.active_experts))))
    if gated:
        self._apply_gate(up_out)
    else:
        self.act_fn(up_out)

    weighted = down_out * top_k_weights.reshape(-1)[perm].unsqueeze(-1).to(down_out.dtype)
    inv_perm = torch.empty_like(perm)
    restored = weighted[inv_perm]
    return restored.view(tokens, top_k, hidden_size).sum(dim=1).to(hidden_states.dtype)


def register() -> None:
    from transformers.integrations.moe import ExpertsInterface
    ExpertsInterface.register(IMPLEMENTATION_NAME, tracecost_experts)
