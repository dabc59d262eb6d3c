"""A meta cache: attention layers hold exactly `context_length` tokens, recurrent layers a constant-size state.

`update` costs what a serving engine pays: writing the Q new tokens into (paged) cache slots. HF's
DynamicCache concatenates the whole cache every step; that copy is an artifact of HF and is never
recorded here. The returned keys/values span context + query tokens, so attention sees them all.

Layers of a recurrent kind (Mamba, linear attention, short convolutions) are transformers' own
`LinearAttentionLayer`, on meta; the model's layer types decide which layer gets which, as in
`DynamicCache(config=...)`.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, LinearAttentionCacheLayerMixin, LinearAttentionLayer

from .recorder import active_recorder
from .work import OTHER, VECTOR


class MetaKVLayer(CacheLayerMixin):
    is_sliding = False
    is_compileable = False

    def __init__(self, context_length: int, **kwargs):
        super().__init__()
        self.context_length = context_length
        self.is_initialized = True
        # nothing stored yet (what a layer with no cached tokens holds, e.g. Mllama's cross-attention without images)
        self.keys = self.values = torch.empty(0, device="meta")

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
        self.keys, self.values = keys, values  # models that share KV between layers read them from here
        if rec is not None:
            rec.inline.tag_cache(keys, values)
        return keys, values

    def update_indexer(self, indexer_keys: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        """DeepSeek sparse attention's indexer keys [B, Q, D]: written like KV, returned over the whole context."""
        rec = active_recorder()
        if rec is not None:
            rec.record("tracecost.kv_cache_write", OTHER, VECTOR, 0.0, [indexer_keys], [],
                       bytes_written=indexer_keys.numel() * rec.kv_element_size, kv_cache_write=True)
        keys = indexer_keys.new_empty(indexer_keys.shape[0], self.context_length + indexer_keys.shape[1],
                                      indexer_keys.shape[-1])
        if rec is not None:
            rec.inline.tag_indexer(keys)
        return keys

    def get_seq_length(self) -> int:
        return self.context_length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.context_length + query_length, 0

    def get_max_length(self) -> int:
        return -1


class MetaStateLayer(LinearAttentionLayer):
    """transformers' own state layer: conv and recurrent states, lazily shaped by the first forward."""


class MetaHybridLayer(LinearAttentionLayer, MetaKVLayer):
    """A layer with both a state and attention KV (e.g. Falcon-H1's parallel Mamba and attention)."""

    def __init__(self, context_length: int, number_of_states: int = 1, **kwargs):
        MetaKVLayer.__init__(self, context_length)
        LinearAttentionLayer.__init__(self, number_of_states=number_of_states)

    def lazy_initialization(self, *args, **kwargs) -> None:
        if len(args) == 0:
            LinearAttentionLayer.lazy_initialization(self, **kwargs)


def _layer(layer_type: str | None, context_length: int, kwargs: dict):
    from transformers.cache_utils import DYNAMIC_LAYER_TYPE_MAPPING
    cls = DYNAMIC_LAYER_TYPE_MAPPING.get(layer_type) if layer_type else None
    states = {"number_of_states": kwargs.get("number_of_states", 1)}
    if cls is not None and issubclass(cls, LinearAttentionCacheLayerMixin):
        if issubclass(cls, CacheLayerMixin):
            return MetaHybridLayer(context_length, **states)
        return MetaStateLayer(**states)
    return MetaKVLayer(context_length)


class MetaKVCache(Cache):
    def __init__(self, num_layers: int, context_length: int, config=None):
        layer_types, kwargs = [None] * num_layers, {}
        if config is not None:
            from transformers.cache_utils import get_layer_types_and_kwargs
            text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
            try:
                layer_types, kwargs = get_layer_types_and_kwargs(text)
            except Exception:  # noqa: BLE001 - a config without layer kinds: plain attention layers
                layer_types = [None] * num_layers
            layer_types = list(layer_types) + [None] * max(0, num_layers - len(layer_types))
        # transformers 5.17 returns one kwargs dict for all layers, later releases one per layer
        per_layer = kwargs if isinstance(kwargs, list) else [kwargs] * len(layer_types)
        per_layer = list(per_layer) + [{}] * max(0, len(layer_types) - len(per_layer))
        layers = [_layer(t, context_length, kw) for t, kw in zip(layer_types, per_layer)]
        text = config.get_text_config(decoder=True) if config is not None and hasattr(config, "get_text_config") \
            else config
        for i in getattr(text, "cross_attention_layers", None) or []:  # Mllama: no image in a text-only context
            if i < len(layers) and isinstance(layers[i], MetaKVLayer):
                layers[i] = MetaKVLayer(0)
        super().__init__(layers=layers)
        self.context_length = context_length

    @property
    def has_states(self) -> bool:
        return any(isinstance(layer, LinearAttentionCacheLayerMixin) for layer in self.layers)

    def continue_states(self) -> None:
        """After a warm-up step shaped the states: every recurrent layer now continues a cached state."""
        for layer in self.layers:
            if isinstance(layer, LinearAttentionCacheLayerMixin):
                for i in layer.has_previous_state:
                    layer.has_previous_state[i] = True

    def get_seq_length(self, layer_idx: int = 0) -> int:
        layer = self.layers[layer_idx] if 0 <= layer_idx < len(self.layers) else None
        return layer.context_length if isinstance(layer, MetaKVLayer) else self.context_length

    def update_indexer(self, indexer_keys: torch.Tensor, layer_idx: int) -> torch.Tensor:
        return self.layers[layer_idx].update_indexer(indexer_keys)

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.context_length + query_length, 0


def model_cache(model, num_layers: int, context_length: int, config, batch: int = 1):
    """The meta cache, as an instance of the model's own DynamicCache subclass where its modeling file defines one
    that its forward insists on (MiniMax's lightning-attention cache), or the model's own state cache on meta
    where it keeps no KV at all (xLSTM)."""
    import sys

    from transformers.cache_utils import DynamicCache
    cache = MetaKVCache(num_layers, context_length, config)
    module = sys.modules.get(type(model).__module__)
    states = getattr(module, type(model).__name__.replace("ForCausalLM", "Cache"), None)
    if isinstance(states, type) and not issubclass(states, Cache) and hasattr(states, "reset"):
        return states(config, max_batch_size=batch, dtype=next(model.parameters()).dtype, device="meta")
    own = [c for c in vars(module).values() if isinstance(c, type) and issubclass(c, DynamicCache)
           and c.__module__ == module.__name__] if module is not None else []
    if len(own) != 1:
        return cache
    wrapped = own[0]()
    wrapped.__class__ = type("Meta" + own[0].__name__, (MetaKVCache, own[0]), {})
    wrapped.layers, wrapped.context_length = cache.layers, context_length
    return wrapped
