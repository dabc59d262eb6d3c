"""Attention as one op with exact work, plugged into transformers' AttentionInterface by name.

No mask is built (a registered implementation outside the mask mapping gets none): causality,
the sliding window and the alignment of the queries to the end of the keys are known exactly,
so the work is counted in closed form rather than from a dense mask.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .work import ATTENTION, MATRIX, AttentionWork

if TYPE_CHECKING:  # the work formulas above the recording hook need no torch: the cost model imports them
    import torch

IMPLEMENTATION_NAME = "tracecost"


def chunked_pairs(query_length: int, context_length: int, chunk: int) -> int:
    """Pairs when a query at position p sees only the keys of its chunk: p - floor(p / chunk) * chunk + 1 each."""
    total = 0
    p, end = context_length, context_length + query_length
    while p < end:
        chunk_end = min(end, (p // chunk + 1) * chunk)
        first, last = p % chunk + 1, (chunk_end - 1) % chunk + 1
        total += (first + last) * (chunk_end - p) // 2
        p = chunk_end
    return total


def causal_pairs(query_length: int, context_length: int, window: int | None = None) -> int:
    """Query-key pairs executed for one sequence: sum over queries i of min(C + i + 1, window)."""
    first, last = context_length + 1, context_length + query_length  # keys seen by the first and last query
    if window is None or window >= last:
        return (first + last) * query_length // 2
    if window <= first:
        return window * query_length
    growing = window - first  # queries that see fewer than `window` keys
    return (first + window - 1) * growing // 2 + window * (query_length - growing)


def keys_read(query_length: int, context_length: int, window: int | None = None) -> int:
    """Keys (per KV head) that some query attends to: all C + Q, or the window span."""
    total = context_length + query_length
    return total if window is None else min(total, window + query_length - 1)


def attention_work(batch: int, heads: int, kv_heads: int, qk_head_dim: int, v_head_dim: int, query_length: int,
                   context_length: int, window: int | None = None, kv_shares_storage: bool = False,
                   has_sinks: bool = False, causal: bool = True, chunk: int | None = None,
                   expanded_head_dims: tuple[int, int] | None = None) -> AttentionWork:
    if not causal:
        pairs, keys = query_length * (context_length + query_length), context_length + query_length
        window = chunk = None
    elif chunk:
        pairs = chunked_pairs(query_length, context_length, chunk)
        keys = context_length + query_length - (context_length // chunk) * chunk
        window = None
    else:
        pairs, keys = causal_pairs(query_length, context_length, window), keys_read(query_length, context_length, window)
    return AttentionWork(batch=batch, heads=heads, kv_heads=kv_heads, qk_head_dim=qk_head_dim,
                         v_head_dim=v_head_dim, query_length=query_length, context_length=context_length,
                         window=window, pairs_per_sequence=pairs, kv_tokens_read=keys,
                         kv_shares_storage=kv_shares_storage, has_sinks=has_sinks, causal=causal, chunk=chunk,
                         expanded_head_dims=expanded_head_dims)


def attention_flops(w: AttentionWork) -> float:
    # QK^T costs 2*d_qk per pair and PV costs 2*d_v per pair: 4*heads*head_dim*pairs when they match.
    return 2.0 * w.batch * w.heads * w.pairs_per_sequence * (w.qk_head_dim + w.v_head_dim)


def attention_bytes(w: AttentionWork, act_bytes: int, kv_bytes: int) -> tuple[float, float]:
    """(read, written): Q read and O written once; K and V read once per KV head (GQA never repeats them)."""
    q = w.batch * w.heads * w.query_length * w.qk_head_dim * act_bytes
    o = w.batch * w.heads * w.query_length * w.v_head_dim * act_bytes
    k = w.batch * w.kv_heads * w.kv_tokens_read * w.qk_head_dim * kv_bytes
    v = 0 if w.kv_shares_storage else w.batch * w.kv_heads * w.kv_tokens_read * w.v_head_dim * kv_bytes
    sinks = w.heads * 4 if w.has_sinks else 0
    return q + k + v + sinks, o


def record_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, window: int | None,
                     sinks: torch.Tensor | None = None, kv_shares_storage: bool = False, causal: bool = True,
                     chunk: int | None = None, expanded_head_dims: tuple[int, int] | None = None) -> torch.Tensor:
    """Record attention over [B, H, Q, D] queries and [B, Hkv, C+Q, D] keys; return [B, Q, H, Dv]."""
    batch, heads, q_len, qk_dim = query.shape
    kv_heads, kv_len, v_dim = key.shape[1], key.shape[2], value.shape[-1]
    from .recorder import active_recorder
    out = query.new_empty(batch, q_len, heads, v_dim)
    rec = active_recorder()
    if rec is not None:
        if window is not None and (not isinstance(window, int) or window <= 0):
            window = None
        work = attention_work(batch, heads, kv_heads, qk_dim, v_dim, q_len, max(0, kv_len - q_len), window,
                              kv_shares_storage, sinks is not None, causal, chunk, expanded_head_dims)
        read, written = attention_bytes(work, query.element_size(), rec.kv_element_size)
        rec.record("tracecost.attention", ATTENTION, MATRIX, attention_flops(work), [query, key, value], [out],
                   bytes_read=read, bytes_written=written, attention=work)
    return out


def sparse_attention(module) -> bool:
    """DeepSeek sparse attention: a module with its own top-k indexer, or one that reuses the picks of another
    layer's (GLM-5's shared layers, skip_topk)."""
    return hasattr(module, "indexer") or hasattr(module, "skip_topk")


def module_window(module) -> int | None:
    """Keys a query attends to: the sliding window, GPT-Neo's local window, or DeepSeek sparse attention's top-k
    (a query attends to the k keys its indexer selects: the same pairs as a window of k)."""
    config = getattr(module, "config", None)
    if sparse_attention(module) and getattr(config, "index_topk", None):
        return config.index_topk
    window = getattr(module, "sliding_window", None)
    if window is None and getattr(module, "attention_type", None) == "local":  # GPT-Neo's local layers
        window = getattr(getattr(module, "config", None), "window_size", None)
    return window if isinstance(window, int) and window > 0 else None


def module_chunk(module) -> int | None:
    """Chunked local attention (Llama-4's RoPE layers): the chunk size, where this attention module uses one."""
    config = getattr(module, "config", None)
    chunk = getattr(config, "attention_chunk_size", None)
    if not chunk or not getattr(module, "use_rope", False):
        return None
    return chunk


def tracecost_attention(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0,
                        sliding_window=None, s_aux=None, sinks=None, **kwargs):
    """AttentionInterface implementation: the exact work of a fused (flash) attention kernel."""
    window = sliding_window if sliding_window is not None else kwargs.get("window_size")
    if window is None:
        window = module_window(module)
    causal = getattr(module, "is_causal", True) is not False
    return record_attention(query, key, value, window, sinks=s_aux if s_aux is not None else sinks,
                            causal=causal, chunk=module_chunk(module) if causal else None), None


def register() -> None:
    from transformers import AttentionInterface
    AttentionInterface.register(IMPLEMENTATION_NAME, tracecost_attention)
