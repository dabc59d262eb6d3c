"""Build the real HF model class from a config on the meta device, and group its identical layers."""
from __future__ import annotations

import json
import warnings
from collections import OrderedDict
from dataclasses import dataclass

import torch

from . import attention, compat, experts, mla  # noqa: F401
from .model_source import ModelError, ModelSpec

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class BuiltModel:
    model: torch.nn.Module
    config: object
    num_layers: int
    layer_groups: list[list[int]]  # each group: indices of identical decoder layers, first is traced
    params: int
    active_params: int
    mla_modules: int


def active_params(model: torch.nn.Module, config) -> int:
    """Parameters one token touches: routed experts count only for the k of E a token is sent to."""
    top_k = getattr(config, "num_experts_per_tok", None)
    inactive = 0
    for module in model.modules():
        if hasattr(module, "gate_up_proj") and hasattr(module, "down_proj") and module.down_proj.dim() == 3 and top_k:
            n_exp = module.down_proj.shape[0]
            expert_params = sum(p.numel() for p in module.parameters(recurse=False))
            inactive += expert_params * (n_exp - min(top_k, n_exp)) // n_exp
    return sum(p.numel() for p in model.parameters()) - inactive


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList | None:
    for name in ("model.layers", "model.language_model.layers", "transformer.h", "model.decoder.layers"):
        obj = model
        for part in name.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if isinstance(obj, torch.nn.ModuleList):
            return obj
    return None


def _layer_signature(layer: torch.nn.Module, layer_type: str | None) -> tuple:
    params = tuple((n, tuple(p.shape), p.dtype) for n, p in layer.named_parameters())
    modules = tuple(type(m).__name__ for m in layer.modules())
    window = getattr(getattr(layer, "self_attn", None), "sliding_window", None)
    return (type(layer).__name__, layer_type, window, params, modules)


def group_layers(layers: torch.nn.ModuleList, config) -> list[list[int]]:
    layer_types = getattr(config, "layer_types", None) or [None] * len(layers)
    groups: OrderedDict[tuple, list[int]] = OrderedDict()
    for i, layer in enumerate(layers):
        groups.setdefault(_layer_signature(layer, layer_types[i] if i < len(layer_types) else None), []).append(i)
    return list(groups.values())


def _skip_layer(hidden_states, *args, **kwargs):
    return hidden_states


def make_config(spec: ModelSpec, trust_remote_code: bool):
    from transformers import AutoConfig, CONFIG_MAPPING
    fields = {k: v for k, v in spec.config.items() if not k.startswith("_")}
    model_type = fields.pop("model_type")
    if model_type not in CONFIG_MAPPING:
        if "auto_map" in fields and not trust_remote_code:
            raise ModelError(f"model type '{model_type}' needs its own remote code; rerun with --trust-remote-code "
                             f"if you trust {spec.origin}")
        if not trust_remote_code:
            raise ModelError(f"model type '{model_type}' is not supported by transformers {compat.transformers_version()}")
        if spec.folder is None:
            raise ModelError(f"{spec.name}: remote code needs the model's folder, not just its config")
        try:
            return AutoConfig.from_pretrained(spec.folder, trust_remote_code=True)
        except Exception as e:  # noqa: BLE001 - the remote code is the user's; report it in one line
            raise ModelError(f"cannot load remote config code from {spec.folder}: {type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}") from None
    try:
        return AutoConfig.for_model(model_type, **fields)
    except Exception as e:  # noqa: BLE001 - any config error is a user-facing model error
        raise ModelError(f"invalid config for model type '{model_type}': {str(e).splitlines()[0]}") from None


_BUILD_CACHE: OrderedDict = OrderedDict()


def build_model(spec: ModelSpec, dtype: str = "bf16", mla_form: str = "absorbed", trust_remote_code: bool = False,
                dedup_layers: bool = True) -> BuiltModel:
    """The model on meta, with tracecost's attention and experts implementations; cached per config."""
    key = (json.dumps(spec.config, sort_keys=True), dtype, mla_form, trust_remote_code, dedup_layers)
    if key in _BUILD_CACHE:
        _BUILD_CACHE.move_to_end(key)
        return _BUILD_CACHE[key]
    from transformers import AutoModelForCausalLM

    config = make_config(spec, trust_remote_code)
    if mla_form not in mla.FORMS:
        raise ModelError(f"unknown MLA form '{mla_form}' (choose from {', '.join(mla.FORMS)})")
    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = AutoModelForCausalLM.from_config(
                config, dtype=TORCH_DTYPES[dtype], attn_implementation=attention.IMPLEMENTATION_NAME,
                experts_implementation=experts.IMPLEMENTATION_NAME, trust_remote_code=trust_remote_code)
    except ModelError:
        raise
    except Exception as e:  # noqa: BLE001
        raise ModelError(f"cannot build {spec.name} ({type(config).__name__}) on meta: "
                         f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    model.eval()
    layers = decoder_layers(model)
    if layers is None:
        raise ModelError(f"{spec.name}: no decoder layer list found in {type(model).__name__}")
    groups = group_layers(layers, config) if dedup_layers else [[i] for i in range(len(layers))]
    for group in groups:
        for i in group[1:]:
            layers[i].forward = _skip_layer
    mla_modules = mla.use_absorbed_form(model) if mla_form == "absorbed" else sum(
        1 for m in model.modules() if mla.is_mla(m))
    built = BuiltModel(model=model, config=config, num_layers=len(layers), layer_groups=groups,
                       params=sum(p.numel() for p in model.parameters()),
                       active_params=active_params(model, config), mla_modules=mla_modules)
    _BUILD_CACHE[key] = built
    while len(_BUILD_CACHE) > 4:
        _BUILD_CACHE.popitem(last=False)
    return built
