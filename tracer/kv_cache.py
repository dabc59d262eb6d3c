"""A meta KV cache that holds exactly `context_length` tokens per layer.

`update` costs what a serving engine pays: writing the Q new tokens into (paged) cache slots. HF's
DynamicCache concatenates the whole cache every step; that copy is an artifact of HF and is never
recorded here. The returned keys/values span context + query tokens, so attention sees them all.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from .recorder import active_recorder
from .work import OTHER, VECTOR


class MetaKVLayer(CacheLayerMixin):
    is_sliding = False
    is_compileable = False

    def __init__(self, context_length: int):
        super().__init__()
        self.context_length = context_length
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states):
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        rec = active_recorder()
        if rec is not None:
            written = (key_states.numel() + value_states.numel()) * rec.kv_element_size
            rec.record("tracecost.kv_cache_write", OTHER, VECTOR, 0.0, [key_states, value_states], [],
                       bytes_written=written, kv_cache_write=True)
        total = self.context_length + key_states.shape[-2]
        keys = key_states.new_empty(*key_states.shape[:-2], total, key_states.shape[-1])
        values = value_states.new_empty(*value_states.shape[:-2], total, value_states.shape[-1])
        return keys, values

    def get_seq_length(self) -> int:
        return self.context_length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.context_length + query_length, 0

    def get_max_length(self) -> int:
        return -1


class MetaKVCache(Cache):
    def __init__(self, num_layers: int, context_length: int):
        super().__init__(layers=[MetaKVLayer(context_length) for _ in range(num_layers)])
        self.context_length = context_length

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.context_length
