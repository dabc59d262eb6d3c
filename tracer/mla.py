"""Multi-head latent attention (DeepSeek V2/V3) in the absorbed form serving engines run.

HF re-expands the whole latent cache through kv_b_proj every step (K and V per head for all
C + Q tokens). Engines (vLLM, SGLang) absorb kv_b_proj's key half into the query and its value
half into the output, so attention runs in the latent space as multi-query attention with one
KV head of kv_lora_rank + rope dims, and V is the first kv_lora_rank dims of that same cache.

DeepSeek sparse attention (V3.2, GLM-5) keeps that form: its indexer scores every cached key with its own small
projections and key cache, and the absorbed attention reads the top index_topk keys it picks (vLLM's and
SGLang's sparse FlashMLA over the latent cache; HF instead caches the expanded K and V). GLM-5's shared layers
run no indexer of their own: they reuse the picks of the last layer that did.
"""
from __future__ import annotations

import contextlib
import inspect
import types

import torch

from .attention import module_window, record_attention, sparse_attention
from .recorder import active_recorder
from .weight_formats import MLA_ABSORBED
from .work import OTHER, VECTOR

FORMS = ("absorbed", "hf")


def is_mla(module: torch.nn.Module) -> bool:
    return hasattr(module, "kv_lora_rank") and hasattr(module, "kv_b_proj") and hasattr(module, "kv_a_proj_with_mqa")


def fits_absorbed_form(module: torch.nn.Module) -> bool:
    """DeepSeek-V2/V3's layout: a query from q_proj or q_a_proj -> q_b_proj, and kv_b_proj holding K-nope and V;
    with DeepSeek sparse attention, an indexer that takes the query's low-rank residual (V3.2's, GLM-5's)."""
    return is_mla(module) and (hasattr(module, "q_proj") or hasattr(module, "q_b_proj")) and all(
        hasattr(module, a) for a in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "num_heads")) and (
        not sparse_attention(module) or _absorbable_indexer(module))


def _absorbable_indexer(module: torch.nn.Module) -> bool:
    """An indexer over the query's low-rank residual (DeepSeek-V3.2's, GLM-5's), or none on a layer that reuses the
    top-k a previous layer's indexer picked (GLM-5's shared layers, skip_topk)."""
    if getattr(module, "q_lora_rank", None) is None:
        return False
    indexer = getattr(module, "indexer", None)
    if indexer is None:
        return bool(getattr(module, "skip_topk", False))
    params = inspect.signature(indexer.forward).parameters
    return all(p in params for p in ("hidden_states", "q_resid", "position_embeddings", "attention_mask",
                                     "past_key_values"))


def _run_indexer(self, hidden_states: torch.Tensor, q_resid: torch.Tensor, kwargs: dict) -> torch.Tensor:
    """The DSA indexer as HF runs it: its projections, its key-cache write and its scores over every cached key are
    recorded on the way (tracer/kv_cache.py update_indexer, tracer/inline_attention.py)."""
    batch, tokens = hidden_states.shape[:-1]
    cache = kwargs.get("past_key_values")
    keys = tokens + (cache.get_seq_length(self.layer_idx) if cache is not None else 0)
    mask = kwargs.get("attention_mask")
    mask = mask[:, 0] if mask is not None and mask.dim() == 4 else \
        hidden_states.new_empty(batch, tokens, keys, dtype=torch.bool)
    return self.indexer(hidden_states, q_resid, kwargs.get("position_embeddings"), mask, kwargs.get("position_ids"),
                        past_key_values=cache)


def _rotate(x: torch.Tensor, positions: int) -> torch.Tensor:
    # rotary on the rope dims: x*cos + rotate_half(x)*sin, same elementwise work whatever the layout
    table_shape = (positions,) + (1,) * (x.dim() - 3) + (x.shape[-1],)
    cos, sin = x.new_empty(table_shape), x.new_empty(table_shape)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _absorbed(rec):
    """kv_b_proj's halves multiplied per head outside their Linear: engines run them as their own bmm."""
    return rec.role(MLA_ABSORBED) if rec is not None else contextlib.nullcontext()


def absorbed_forward(self, hidden_states: torch.Tensor, *args, **kwargs):
    batch, tokens = hidden_states.shape[:-1]
    picks = kwargs.get("prev_topk_indices")
    heads, nope, rope, latent, v_dim = (self.num_heads, self.qk_nope_head_dim, self.qk_rope_head_dim,
                                        self.kv_lora_rank, self.v_head_dim)
    if self.q_lora_rank is None:
        q = self.q_proj(hidden_states)
    else:
        q_resid = self.q_a_layernorm(self.q_a_proj(hidden_states))
        q = self.q_b_proj(q_resid)
        if getattr(self, "indexer", None) is not None:   # a shared layer reuses the last indexer's picks
            picks = _run_indexer(self, hidden_states, q_resid, kwargs)
    q = q.view(batch, tokens, heads, nope + rope)
    q_nope, q_rot = torch.split(q, [nope, rope], dim=-1)

    compressed = self.kv_a_proj_with_mqa(hidden_states)
    kv_latent, k_rot = torch.split(compressed, [latent, rope], dim=-1)
    kv_latent = self.kv_a_layernorm(kv_latent)
    q_rot, k_rot = _rotate(q_rot, tokens), _rotate(k_rot, tokens)

    rec = active_recorder()
    context = rec.context_length if rec is not None else 0
    if rec is not None:
        written = batch * tokens * (latent + rope) * rec.kv_element_size
        rec.record("tracecost.kv_cache_write", OTHER, VECTOR, 0.0, [kv_latent, k_rot], [],
                   bytes_written=written, kv_cache_write=True)

    # absorb W_UK into the query: [H, B*T, nope] @ [H, nope, latent]
    w_kv = self.kv_b_proj.weight.view(heads, nope + v_dim, latent)
    w_uk, w_uv = w_kv[:, :nope, :], w_kv[:, nope:, :]
    q_nope = q_nope.permute(2, 0, 1, 3).reshape(heads, batch * tokens, nope)
    with _absorbed(rec):
        q_latent = torch.bmm(q_nope, w_uk)

    query = q_latent.new_empty(batch, heads, tokens, latent + rope)
    keys = kv_latent.new_empty(batch, 1, context + tokens, latent + rope)
    # sparse attention prefills in the latent form too (FlashMLA's sparse kernels gather the picked latents)
    out = record_attention(query, keys, keys[..., :latent], window=module_window(self), kv_shares_storage=True,
                           expanded_head_dims=None if sparse_attention(self) else (nope + rope, v_dim))

    # absorb W_UV into the output: [H, B*T, latent] @ [H, latent, v]
    out = out.permute(2, 0, 1, 3).reshape(heads, batch * tokens, latent)
    with _absorbed(rec):
        out = torch.bmm(out, w_uv.transpose(1, 2))
    out = out.view(heads, batch, tokens, v_dim).permute(1, 2, 0, 3).reshape(batch, tokens, heads * v_dim)
    # GLM-5's layers hand their top-k picks on to the next (its attention returns them third)
    return (self.o_proj(out), None, picks) if self._returns_picks else (self.o_proj(out), None)


def use_absorbed_form(model: torch.nn.Module) -> int:
    """Swap every MLA attention module's forward for the absorbed one; returns how many were swapped."""
    swapped = 0
    for module in model.modules():
        if fits_absorbed_form(module):
            module._returns_picks = "prev_topk_indices" in inspect.signature(module.forward).parameters
            module.forward = types.MethodType(absorbed_forward, module)
            swapped += 1
    return swapped
