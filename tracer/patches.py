"""What tracecost swaps in for the traced forward only, and puts back afterwards.

- Attention: models that go through transformers' AttentionInterface get tracecost's implementation by name
  at build time. The others call an attention function of their own modeling file (`eager_attention_forward`),
  the interface's "sdpa" entry, or torch's `scaled_dot_product_attention` directly: all three are bound to
  tracecost's attention op for the forward, so attention is ONE op that sees the whole cached context.
- Recurrent kernels: the module-level functions named in `recurrent.KERNELS` (SSM scans, gated delta rules,
  short convolutions) are bound to tracecost's single-op versions.
- The LM head: logits for the last token of each sequence (unless all logits are asked for), also in models
  whose forward has no `logits_to_keep`.
"""
from __future__ import annotations

import contextlib
import sys
import weakref

import torch

from . import recurrent
from .attention import module_chunk, module_window, record_attention, tracecost_attention

_INTERFACE_KEYS = ("sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")
# mask builders: tracecost's attention knows causality, windows and chunks exactly, so no mask is built
_MASK_BUILDERS = ("create_causal_mask", "create_sliding_window_causal_mask", "create_chunked_causal_mask",
                  "create_bidirectional_mask", "_prepare_4d_causal_attention_mask",
                  "_prepare_4d_causal_attention_mask_for_sdpa", "_prepare_4d_causal_attention_mask_with_cache_position")


def _meta_mask(*args, **kwargs):
    """An empty [B, 1, Q, C+Q] mask on meta (no work): code that combines or converts the mask still runs, and
    tracecost's attention ignores it."""
    import torch
    embeds = kwargs.get("inputs_embeds", kwargs.get("input_embeds"))
    if embeds is None:
        embeds = next((a for a in args if isinstance(a, torch.Tensor) and a.dim() == 3), None)
    cache = kwargs.get("past_key_values", kwargs.get("cache"))
    past = kwargs.get("past_key_values_length")
    if past is None:
        past = cache.get_seq_length() if cache is not None and hasattr(cache, "get_seq_length") else 0
        if not cache and len(args) >= 4 and isinstance(args[3], int):  # _prepare_4d_causal_attention_mask
            past = args[3]
    if embeds is None:
        return None
    batch, length = embeds.shape[0], embeds.shape[1]
    padding = kwargs.get("attention_mask")
    keys = padding.shape[-1] if isinstance(padding, torch.Tensor) and padding.dim() == 2 else past + length
    return torch.empty(batch, 1, length, keys, dtype=embeds.dtype, device="meta")


def _meta_length_masks(slen, lengths, causal, padding_mask=None):
    """XLM's `get_masks` on meta: the [B, S] padding mask (every token real) and the attention mask, [B, S, S] when
    causal; tracecost's attention knows causality itself."""
    batch = lengths.size(0)
    mask = torch.ones(batch, slen, dtype=torch.bool, device="meta")
    return mask, torch.ones(batch, slen, slen, dtype=torch.bool, device="meta") if causal else mask


_LENGTH_MASK_BUILDERS = ("get_masks",)  # modeling_xlm.py, modeling_flaubert.py


def _sdpa(recorder):
    """torch's scaled_dot_product_attention, called directly by a model, as one tracecost attention op."""
    def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
                  **kwargs):
        module = next((m for m in reversed(recorder.modules) if hasattr(m, "is_causal")
                       or hasattr(m, "sliding_window")), None)
        causal = is_causal or getattr(module, "is_causal", True) is not False
        out = record_attention(query, key, value, module_window(module), causal=causal,
                               chunk=module_chunk(module) if causal and module is not None else None)
        return out.transpose(1, 2)  # SDPA returns [B, H, Q, Dv]
    return attention


def _eager_attention(module, query, key, value, attention_mask=None, *args, **kwargs):
    if args:  # positional scaling / dropout
        kwargs.setdefault("scaling", args[0])
    return tracecost_attention(module, query, key, value, attention_mask, **kwargs)


_MODULE_CLASSES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def module_classes(model: torch.nn.Module) -> frozenset:
    """The classes of every module of a built model: its module tree walked once per model (a trace asks several
    times, and the tree of a built model does not change)."""
    classes = _MODULE_CLASSES.get(model)
    if classes is None:
        classes = _MODULE_CLASSES[model] = frozenset(type(m) for m in model.modules())
    return classes


def _modeling_modules(model: torch.nn.Module) -> list:
    """The transformers modeling files the model's classes come from."""
    names = sorted({cls.__module__ for cls in module_classes(model)})
    return [sys.modules[n] for n in names if n in sys.modules and n.startswith("transformers.models.")]


@contextlib.contextmanager
def patched(model: torch.nn.Module, recorder, logits_rows: int | None):
    """Within: tracecost's attention and recurrent kernels bound in the model's modeling files, the LM head on
    the last `logits_rows` positions of each sequence (None: all)."""
    from transformers.modeling_utils import AttentionInterface
    saved: list[tuple[object, str, object]] = []

    def bind(owner, name, value):
        saved.append((owner, name, owner[name] if isinstance(owner, dict) else getattr(owner, name)))
        if isinstance(owner, dict):
            owner[name] = value
        else:
            setattr(owner, name, value)

    for module in _modeling_modules(model):
        for name, replacement in recurrent.KERNELS.items():
            if callable(getattr(module, name, None)):
                bind(module, name, replacement)
        if callable(getattr(module, "eager_attention_forward", None)):
            bind(module, "eager_attention_forward", _eager_attention)
        for name in _MASK_BUILDERS:
            if callable(getattr(module, name, None)):
                bind(module, name, _meta_mask)
        for name in _LENGTH_MASK_BUILDERS:
            if callable(getattr(module, name, None)):
                bind(module, name, _meta_length_masks)
    from transformers.modeling_utils import PreTrainedModel
    bind(PreTrainedModel, "warn_if_padding_and_no_attention_mask", lambda *args, **kwargs: None)  # reads token ids
    sdpa = _sdpa(recorder)
    bind(torch.nn.functional, "scaled_dot_product_attention", sdpa)
    for module in _modeling_modules(model):
        if getattr(module, "scaled_dot_product_attention", None) is not None:
            bind(module, "scaled_dot_product_attention", sdpa)
    mapping = AttentionInterface._global_mapping
    for key in _INTERFACE_KEYS:
        if key in mapping:
            bind(mapping, key, tracecost_attention)
    hook = None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if logits_rows is not None and isinstance(head, torch.nn.Module):
        def last_positions(module, args):
            hidden = args[0]
            if isinstance(hidden, torch.Tensor) and hidden.dim() == 3 and hidden.shape[1] > logits_rows:
                return (hidden[:, -logits_rows:],) + tuple(args[1:])
            return None
        hook = head.register_forward_pre_hook(last_positions)
    try:
        yield
    finally:
        if hook is not None:
            hook.remove()
        for owner, name, value in reversed(saved):
            if isinstance(owner, dict):
                owner[name] = value
            else:
                setattr(owner, name, value)


def _inline_attention(self, query, key, value, *args, **kwargs):
    """Legacy `_attn(query, key, value, mask)` methods (GPT-J, CodeGen, GPT-Neo, OpenAI GPT): one attention op.
    The keys' length is read from the values ([B, H, K, Dv]); some of these models pass the keys transposed."""
    batch, kv_heads, kv_len = value.shape[0], value.shape[1], value.shape[-2]
    keys = query.new_empty(batch, kv_heads, kv_len, query.shape[-1])
    out = record_attention(query, keys, value, module_window(self))
    return [out.transpose(1, 2), None]  # a list: OpenAI GPT concatenates it with more outputs


def bloom_attention(self, hidden_states, residual, alibi, attention_mask, layer_past=None, *args, **kwargs):
    """BLOOM: ALiBi attention (inline baddbmm + softmax + bmm in HF) as one op; engines add the ALiBi bias inside
    the flash kernel."""
    batch, length, _ = hidden_states.shape
    query, key, value = self._reshape(self.query_key_value(hidden_states))
    if layer_past is not None:
        key, value = layer_past.update(key, value, self.layer_idx)
    out = record_attention(query, key, value, None).reshape(batch, length, self.num_heads * self.head_dim)
    return self.dense(out) + residual, None


ATTENTION_FORWARDS = {"BloomAttention": bloom_attention}


def xmod_lang_adapter(self, lang_ids, hidden_states):
    """X-MOD: every token of a sequence in one language goes through that language's adapter (HF selects the tokens
    per language with data-dependent indexing); the adapters are identical in shape."""
    residual = hidden_states
    if self.adapter_layer_norm is not None:
        hidden_states = self.adapter_layer_norm(hidden_states)
    elif self.adapter_reuse_layer_norm:
        hidden_states = self.LayerNorm(hidden_states)
    if self.ln_before_adapter:
        residual = hidden_states
    adapter = next(iter(self.adapter_modules.values()))
    return self.dropout(adapter(hidden_states)) + residual


RELATIVE_POSITION_SCORES = "tracecost.relative_position_scores"
# weights applied to a relative-position table (one row per query-key distance of each sequence: K + Q in XLNet's
# "bi" attention, K + 1 in "uni"), not to the tokens, by module class; the position scores op gives the rows
RELATIVE_POSITION_WEIGHTS = {"XLNetRelativeAttention": ("r",)}


def xlnet_rel_attn_core(self, q_head, k_head_h, v_head_h, k_head_r, seg_mat=None, attn_mask=None,
                        output_attentions=False):
    """XLNet's relative attention (modeling_xlnet.py rel_attn_core, Transformer-XL style) over [I, B, N, D] queries:
    content scores (q + r_w_bias) . k, softmax and the product with v are one attention op (causal for
    attn_type "uni", which passes a mask; "bi" passes none and every query sees every key); the position scores
    (q + r_r_bias) . k_r over the relative distances are one more product of the fused scores, recorded as
    such. HF's relative shift and the sum of the score terms are inside the kernel, as for other inline attention."""
    from .recorder import active_recorder
    from .work import GEMM, MATRIX, GemmShape
    if seg_mat is not None or output_attentions:
        raise NotImplementedError("XLNet segment scores or returned attention probabilities")
    q_len, batch, heads, dim = q_head.shape
    content = (q_head + self.r_w_bias).permute(1, 2, 0, 3)   # [B, N, I, D]
    position = (q_head + self.r_r_bias).permute(1, 2, 0, 3)
    keys, values = k_head_h.permute(1, 2, 0, 3), v_head_h.permute(1, 2, 0, 3)
    distances = k_head_r.shape[0]
    scores = position.new_empty(batch, heads, q_len, distances)
    rec = active_recorder()
    if rec is not None:
        rec.record(RELATIVE_POSITION_SCORES, GEMM, MATRIX, 2.0 * batch * heads * q_len * distances * dim,
                   [position, k_head_r], [scores], gemm=GemmShape(m=q_len, n=distances, k=dim, batch=batch * heads))
    out = record_attention(content, keys, values, None, causal=attn_mask is not None)  # [B, I, N, D]
    return out.permute(1, 0, 2, 3)


METHOD_REPLACEMENTS = {"XmodOutput": ("lang_adapter", xmod_lang_adapter),
                       "XLNetRelativeAttention": ("rel_attn_core", xlnet_rel_attn_core)}


def replace_forwards(model: torch.nn.Module) -> int:
    """Modules whose kernel is inline Python (MiniMax lightning attention) or that run experts dense (Llama-4) get
    tracecost's forward; returns how many."""
    import types

    from .experts import ROUTED_FORWARDS, prepare_jetmoe, routed_experts, wants_routed_forward
    forwards = {**recurrent.FORWARDS, **ROUTED_FORWARDS, **ATTENTION_FORWARDS}
    swapped = 0
    for module in model.modules():
        if type(module).__name__ in ("JetMoeMoE", "JetMoeMoA"):
            prepare_jetmoe(module)
        if wants_routed_forward(module):
            module.forward = types.MethodType(routed_experts, module)
            swapped += 1
            continue
        if callable(getattr(type(module), "_attn", None)) and "attention" in type(module).__name__.lower():
            module._attn = types.MethodType(_inline_attention, module)
            swapped += 1
        method = {**recurrent.METHODS, **METHOD_REPLACEMENTS}.get(type(module).__name__)
        if method is not None:
            setattr(module, method[0], types.MethodType(method[1], module))
            swapped += 1
        forward = forwards.get(type(module).__name__)
        if forward is not None:
            module.forward = types.MethodType(forward, module)
            swapped += 1
    return swapped
