"""Device memory of a serving setup: weights, KV cache and peak activations, per device."""
from __future__ import annotations

from dataclasses import dataclass

from tracer.work import Trace
from serving.capacity import expert_weight_bytes, kv_heads, peak_activation_bytes  # shared with serving

GB = 1e9


@dataclass(frozen=True)
class MemoryEstimate:
    weights: float          # bytes per device
    kv_cache: float         # attention layers' KV: grows with the cached tokens
    activations: float
    capacity: float
    state_cache: float = 0.0  # recurrent layers' state (SSM, linear attention, conv): constant per sequence

    @property
    def total(self) -> float:
        return self.weights + self.kv_cache + self.state_cache + self.activations

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    def as_gb(self) -> dict[str, float]:
        out = {"weights": self.weights / GB, "kv_cache": self.kv_cache / GB, "activations": self.activations / GB,
               "total": self.total / GB, "capacity": self.capacity / GB}
        if self.state_cache:
            out["state_cache"] = self.state_cache / GB
        return out


def kv_cache_bytes(trace: Trace, tokens: int, tp: int) -> float:
    """KV for `tokens` cached tokens on one device: KV heads shard over TP ranks, a single latent head does not."""
    return trace.kv_bytes_per_token * tokens / max(1, min(tp, kv_heads(trace)))


def state_cache_bytes(trace: Trace, sequences: int, tp: int) -> float:
    """Recurrent states of `sequences` sequences on one device: constant in length; heads/channels shard over TP."""
    return trace.state_bytes_per_sequence * sequences / max(1, tp)


def estimate_memory(trace: Trace, cached_tokens_total: int, tp: int, ep: int, capacity_gb: float,
                    sequences: int | None = None, expert_resident: float = 1.0) -> MemoryEstimate:
    """`cached_tokens_total`: KV tokens of all sequences; `sequences`: how many sequences hold a recurrent state
    (required for models with recurrent layers); `expert_resident`: what the routed experts occupy in the engine's
    layout over their stored bytes (cost/op_formats.py expert_resident)."""
    if trace.state_bytes_per_sequence and sequences is None:
        raise ValueError(f"{trace.model} has recurrent layers: memory needs the number of sequences")
    # TP shards every weight; EP shards the routed experts, which hold nearly all of an MoE model's weights
    weights = (trace.weight_bytes + expert_weight_bytes(trace) * (expert_resident - 1.0)) / max(tp, ep)
    return MemoryEstimate(weights=weights, kv_cache=kv_cache_bytes(trace, cached_tokens_total, tp),
                          activations=peak_activation_bytes(trace, tp), capacity=capacity_gb * GB,
                          state_cache=state_cache_bytes(trace, sequences or 0, tp))
