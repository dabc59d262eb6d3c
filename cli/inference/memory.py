"""Device memory of a serving setup: weights, KV cache and peak activations, per device."""
from __future__ import annotations

from dataclasses import dataclass

from tracer.work import Trace

GB = 1e9


@dataclass(frozen=True)
class MemoryEstimate:
    weights: float          # bytes per device
    kv_cache: float
    activations: float
    capacity: float

    @property
    def total(self) -> float:
        return self.weights + self.kv_cache + self.activations

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    def as_gb(self) -> dict[str, float]:
        return {"weights": self.weights / GB, "kv_cache": self.kv_cache / GB, "activations": self.activations / GB,
                "total": self.total / GB, "capacity": self.capacity / GB}


def kv_heads(trace: Trace) -> int:
    return next((op.attention.kv_heads for op in trace.ops if op.attention is not None), 1)


def kv_cache_bytes(trace: Trace, tokens: int, tp: int) -> float:
    """KV for `tokens` cached tokens on one device: KV heads shard over TP ranks, a single latent head does not."""
    return trace.kv_bytes_per_token * tokens / max(1, min(tp, kv_heads(trace)))


def peak_activation_bytes(trace: Trace, tp: int) -> float:
    """The largest working set of one op (inputs + outputs besides weights): what must be live at once."""
    peak = 0.0
    for op in trace.ops:
        live = op.bytes - op.weight_bytes
        if op.attention is not None:  # the KV it reads is cache, already counted
            w = op.attention
            live = w.batch * w.heads * w.query_length * (w.qk_head_dim + w.v_head_dim) * 2
        if op.tp_sharded:
            live /= tp
        peak = max(peak, live)
    return peak


def estimate_memory(trace: Trace, cached_tokens_total: int, tp: int, ep: int, capacity_gb: float) -> MemoryEstimate:
    # TP shards every weight; EP shards the routed experts, which hold nearly all of an MoE model's weights
    weights = trace.weight_bytes / max(tp, ep)
    return MemoryEstimate(weights=weights, kv_cache=kv_cache_bytes(trace, cached_tokens_total, tp),
                          activations=peak_activation_bytes(trace, tp), capacity=capacity_gb * GB)
