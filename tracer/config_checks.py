"""Checks on a model config before anything is built: counts, sizes and head/expert divisibility.

    check_model_config(config, where)   # raises ConfigError (a ModelError) naming the file, the field and the rule
    model_dims(config)                  # the config's attention and expert facts, whatever names it uses

A config that would divide by zero, build no layer, or take minutes to build (10^6 layers) is refused in
one line. The layer limit is TRACECOST_MAX_LAYERS (default 1024; the largest released models have < 200).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from .model_source import ModelError

MAX_LAYERS_ENV = "TRACECOST_MAX_LAYERS"
DEFAULT_MAX_LAYERS = 1024
MAX_SIZE = 10**7          # hidden, intermediate, vocab, head_dim: far above any released model, far below overflow
MAX_EXPERTS = 1 << 16

# each fact under the names configs use for it (HF's own, then older or remote-code spellings)
# decoder_layers, num_decoder_layers: encoder-decoder models (BART, ProphetNet); layers: Kosmos-2's text model
LAYERS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "decoder_layers", "num_decoder_layers", "layers")
# per-layer lists that give the layer count where no count is stored (Nemotron-H derives num_hidden_layers from
# layers_block_type, transformers' configuration_nemotron_h.py)
LAYER_LISTS = ("layers_block_type", "layer_types", "hybrid_override_pattern")
# where a composite config keeps its language model when it has no text_config (transformers'
# PreTrainedConfig.get_text_config looks in the same places): T5Gemma-2, MusicGen and VisionEncoderDecoder in
# `decoder`, BLT's latent transformer in `global_config`
SUB_CONFIGS = ("decoder", "text_decoder", "global_config", "decoder_config", "language_config", "llm_config",
               "vlm_config")   # PI0's PaliGemma
HEADS = ("num_attention_heads", "n_head", "n_heads")
KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num")
HIDDEN = ("hidden_size", "n_embd", "d_model")
EXPERTS = ("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts")
TOP_K = ("num_experts_per_tok", "experts_per_token", "moe_top_k")
SIZES = ("intermediate_size", "moe_intermediate_size", "vocab_size", "head_dim", "kv_lora_rank", "q_lora_rank",
         "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "shared_expert_intermediate_size",
         "max_position_embeddings")
PER_LAYER_SIZES = ("intermediate_size", "moe_intermediate_size")   # a list, one per layer (Gemma-3n, ERNIE-4.5-VL)
# 0 is a stated value, not a degenerate one: head_dim 0 means hidden_size / heads, qk_rope_head_dim 0 an MLA without
# a rotary part (both in GLM-5 Next's default config, transformers' configuration_glm5_next.py)
ZERO_ALLOWED = ("head_dim", "qk_rope_head_dim")


# rope types whose config already states the extended length in max_position_embeddings
_PRESCALED_ROPE = ("llama3", "longrope", "su")


class ConfigError(ModelError):
    """A model config that cannot describe a buildable model."""


@dataclass(frozen=True)
class ModelDims:
    layers: int | None
    heads: int | None
    kv_heads: int | None          # None: the config does not say (then it equals heads)
    routed_experts: int | None    # None: a dense model
    top_k: int | None
    latent_kv: bool               # MLA: one latent KV head shared by every query head
    max_position_embeddings: int | None
    rope_scaling: dict | None

    @property
    def max_context(self) -> int | None:
        """The longest sequence the model was trained for (None: the config does not say)."""
        return max_context(self.max_position_embeddings, self.rope_scaling)


def max_context(max_position_embeddings: int | None, rope_scaling: dict | None) -> int | None:
    """The context a config supports: max_position_embeddings, times the rope factor for rope types that
    extend it at run time (YaRN from its original length, linear and dynamic NTK from the stated one)."""
    if not max_position_embeddings:
        return None
    if not rope_scaling:
        return max_position_embeddings
    rope_type = rope_scaling.get("rope_type", rope_scaling.get("type"))
    factor = rope_scaling.get("factor")
    if rope_type in _PRESCALED_ROPE or isinstance(factor, bool) or not isinstance(factor, (int, float)) \
            or not factor >= 1:
        return max_position_embeddings
    base = max_position_embeddings
    original = rope_scaling.get("original_max_position_embeddings")
    if rope_type == "yarn" and isinstance(original, int) and original > 0:
        base = original
    return max(max_position_embeddings, int(base * factor))


def text_config(config: dict) -> dict:
    """Multimodal configs keep the language model's numbers in text_config, composite ones in a sub-config."""
    inner = config.get("text_config")
    if isinstance(inner, dict):
        return inner
    if _first(config, LAYERS)[0] is None and not any(config.get(k) for k in LAYER_LISTS):
        for key in SUB_CONFIGS:
            if isinstance(config.get(key), dict):
                return text_config(config[key])
    return config


def _first(config: dict, names: tuple) -> tuple[str | None, object]:
    for name in names:
        if config.get(name) is not None:
            return name, config[name]
    return None, None


def max_layers() -> int:
    text = os.environ.get(MAX_LAYERS_ENV)
    if not text:
        return DEFAULT_MAX_LAYERS
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{MAX_LAYERS_ENV} must be an integer, got '{text}'") from None
    return max(1, value)


def _count(config: dict, names: tuple, where: str, low: int, high: int, how: str = "") -> int | None:
    name, value = _first(config, names)
    if name is None:
        return None
    if isinstance(value, list) and name in PER_LAYER_SIZES and value:
        return max(_count({name: v}, (name,), where, low, high, how) for v in value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or int(value) != value:
        raise ConfigError(f"{where}: field '{name}' must be an integer, got {value!r}")
    if not low <= value <= high:
        raise ConfigError(f"{where}: field '{name}' must be in [{low:,}, {high:,}], got {value:,}{how}")
    return int(value)


def model_dims(config: dict, where: str = "config") -> ModelDims:
    c = text_config(config)
    heads = _count(c, HEADS, where, 1, MAX_SIZE)
    experts = _count(c, EXPERTS, where, 1, MAX_EXPERTS)
    return ModelDims(
        layers=_layers(c, where),
        heads=heads, kv_heads=_count(c, KV_HEADS, where, 1, MAX_SIZE), routed_experts=experts,
        top_k=_count(c, TOP_K, where, 1, MAX_EXPERTS) if experts else None,
        latent_kv=bool(c.get("kv_lora_rank")),
        max_position_embeddings=_count(c, ("max_position_embeddings",), where, 1, 1 << 40),
        rope_scaling=next((c[k] for k in ("rope_scaling", "rope_parameters") if isinstance(c.get(k), dict)), None))


def _layers(c: dict, where: str) -> int | None:
    how = f" (more layers than {max_layers():,} take long to build; raise {MAX_LAYERS_ENV} to allow)"
    names = tuple(n for n in LAYERS if n != "layers" or isinstance(c.get(n), int))   # elsewhere a list of modules
    count = _count(c, names, where, 1, max_layers(), how)
    if count is None:
        name, value = _first(c, LAYER_LISTS)
        if isinstance(value, (list, str)) and value:
            count = _count({name: len(value)}, (name,), where, 1, max_layers(), how)
    return count


def check_model_config(config: dict, where: str = "config") -> ModelDims:
    """Refuse a config that would build a wrong or degenerate model; returns its dimensions."""
    c = text_config(config)
    dims = model_dims(config, where)
    if dims.layers is None:
        raise ConfigError(f"{where}: no layer count (one of {', '.join(LAYERS)}, or a per-layer list: "
                          f"{', '.join(LAYER_LISTS)})")
    _count(c, HIDDEN, where, 1, MAX_SIZE)
    for name in SIZES:
        if name in ZERO_ALLOWED and c.get(name) == 0 and not isinstance(c.get(name), bool):
            continue
        _count(c, (name,), where, 1, MAX_SIZE if name != "max_position_embeddings" else 1 << 40)
    heads_name = _first(c, HEADS)[0]
    kv_name = _first(c, KV_HEADS)[0]
    if dims.heads and dims.kv_heads and not dims.latent_kv:
        if dims.kv_heads > dims.heads:
            raise ConfigError(f"{where}: field '{kv_name}' ({dims.kv_heads}) must be <= '{heads_name}' ({dims.heads})")
        if dims.heads % dims.kv_heads:
            raise ConfigError(f"{where}: field '{kv_name}' ({dims.kv_heads}) must divide '{heads_name}' "
                              f"({dims.heads}): each KV head serves a whole group of query heads")
    top_name, top_k = _first(c, TOP_K)
    if dims.routed_experts is not None and top_k is not None:
        if dims.top_k > dims.routed_experts:
            raise ConfigError(f"{where}: field '{top_name}' ({dims.top_k}) must be <= the routed experts "
                              f"({dims.routed_experts})")
    elif top_k is not None and isinstance(top_k, (int, float)) and not isinstance(top_k, bool) and top_k < 1:
        raise ConfigError(f"{where}: field '{top_name}' must be >= 1, got {top_k}")
    return dims
