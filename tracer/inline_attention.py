"""Attention that a model computes inline, as matmul -> softmax -> matmul over the cached keys, as ONE op.

Older modeling files (XGLM, TrOCR, MVP, RoFormer, MPT, BigBird, ...) multiply queries with the cached keys
themselves instead of calling an attention function. The meta cache tags the keys and values it returns;
the tags follow views, casts, copies and elementwise ops on them (GQA repeats, rotary on the keys). The
first weight-free matrix product that reads tagged keys becomes a `tracecost.attention` op with the exact
work (causal pairs over the whole context, K and V read once per KV head); what follows on its scores
(scale, mask, softmax) up to the product with the values is the inside of that fused kernel and is not
recorded again.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from torch.utils.weak import WeakIdKeyDictionary

from .attention import attention_bytes, attention_flops, attention_work, module_chunk, module_window
from .work import ATTENTION, GEMM, MATRIX

if TYPE_CHECKING:
    from .recorder import Recorder

KEY, VALUE, SCORES = "key", "value", "scores"


class InlineAttention:
    def __init__(self, recorder: Recorder):
        self.rec = recorder
        self.tags = WeakIdKeyDictionary()   # tensor -> (kind, kv_heads or attention op index)
        self.batch = 1

    def tag_cache(self, keys, values) -> None:
        self.tags[keys] = (KEY, keys.shape[1] if keys.dim() == 4 else 1, None)
        self.tags[values] = (VALUE, values.shape[1] if values.dim() == 4 else 1, None)

    def tag_indexer(self, keys) -> None:
        """DeepSeek sparse attention's indexer keys: scores q.k per head, then a weighted sum over the heads (one
        multiply-add per head and key: a 'value' of one dimension)."""
        self.tags[keys] = (KEY, 1, 1)

    def follow_view(self, src, outputs) -> None:
        tag = self.tags.get(src)
        if tag is not None:
            for t in outputs:
                self.tags[t] = tag

    def handle(self, op_class: str, operand: str | None, inputs: list, outputs: list) -> bool:
        """True when the op is (part of) inline attention and was recorded here or needs no recording."""
        if not self.tags:
            return False
        tags = [self.tags.get(t) for t in inputs]
        scores = next((t for t in tags if t is not None and t[0] == SCORES), None)
        if scores is not None:
            if op_class == GEMM:   # probabilities x values: the attention op's output
                for t in outputs:
                    self.rec._producer[t] = scores[1]
            else:                  # scale, mask, softmax, dropout on the scores: inside the fused kernel
                for t in outputs:
                    self.tags[t] = scores
            return True
        if op_class == GEMM and operand is None:
            key = next((i for i, t in enumerate(tags) if t is not None and t[0] == KEY), None)
            if key is not None and len(inputs) >= 2:
                query = inputs[1 - key] if key < 2 else inputs[0]
                self._record(query, inputs[key], tags[key][1], outputs, tags[key][2])
                return True
            return False
        # elementwise work on the keys or values (casts, GQA repeats, rotary): recorded, and the tag follows
        for src, tag in zip(inputs, tags):
            if tag is not None and tag[0] in (KEY, VALUE):
                for t in outputs:
                    if t.numel() >= src.numel():
                        self.tags[t] = tag
        return False

    def _record(self, query, key, kv_heads: int, outputs, v_dim: int | None = None) -> None:
        """Scores = query x key^T over [B*H, Q, D] and [B*H, D, K] (or [B*H, K, D]) operands."""
        rec = self.rec
        q_len, qk_dim = query.shape[-2], query.shape[-1]
        if q_len == 0 or qk_dim == 0:
            return
        kv_len = key.shape[-1] if key.shape[-2] == qk_dim else key.shape[-2]  # K^T is [.., D, K]
        groups = query.numel() // (q_len * qk_dim)
        batch = self.batch if groups % max(1, self.batch) == 0 else 1
        heads = max(1, groups // batch)
        if v_dim == 1:  # the DSA indexer multiplies [B, S, H, D] queries: heads are the rows, tokens the batch
            q_len, heads = heads, q_len
        module = next((m for m in reversed(rec.modules) if hasattr(m, "is_causal") or hasattr(m, "sliding_window")),
                      rec.modules[-1])
        causal = getattr(module, "is_causal", True) is not False
        window = module_window(module) if v_dim is None else None  # the indexer itself scores every cached key
        work = attention_work(batch, heads, min(kv_heads, heads), qk_dim, v_dim or qk_dim, q_len,
                              max(0, kv_len - q_len), window, causal=causal,
                              chunk=module_chunk(module) if causal else None)
        read, written = attention_bytes(work, query.element_size(), rec.kv_element_size)
        index = len(rec.ops)
        rec.record("tracecost.attention", ATTENTION, MATRIX, attention_flops(work), [query, key], outputs,
                   bytes_read=read, bytes_written=written, attention=work)
        for t in outputs:
            self.tags[t] = (SCORES, index)
