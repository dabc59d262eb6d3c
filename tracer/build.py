"""Build the real HF model class from a config on the meta device, and group its identical layers."""
from __future__ import annotations

import copy
import json
import sys
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import cached_property

import torch

from . import attention, compat, experts, mla, patches  # noqa: F401
from .layers import DecoderLayers, install
from .model_source import ModelError, ModelSpec
from .module_tree import ModuleTree
from .unmodelled import refusal

IMPLEMENTATION = attention.IMPLEMENTATION_NAME

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class BuiltModel:
    model: torch.nn.Module
    config: object
    num_layers: int
    layers: DecoderLayers            # the decoder layer list, its groups of identical layers and the replay switch
    params: int
    active_params: int
    mla_modules: int
    attn_implementation: str = IMPLEMENTATION
    multimodal: bool = False         # built as *ForConditionalGeneration: the text backbone is what runs
    dedup_verdict: str | None = None  # set by the dedup self-test: None (not run), "ok" or why dedup is off
    warmed: set[str] = field(default_factory=set)  # layer modes an untimed first forward has run in
    notes: list[str] = field(default_factory=list)
    stored_bytes: dict = field(default_factory=dict)  # (weight dtype, from the config) -> stored weight bytes

    @property
    def layer_groups(self) -> list[list[int]]:
        return self.layers.traced_groups()

    @cached_property
    def tree(self) -> ModuleTree:
        """The module tree, walked once (tracer/module_tree.py)."""
        return ModuleTree(self.model)


def _expert_tensors(module: torch.nn.Module) -> bool:
    down = getattr(module, "down_proj", None)
    return isinstance(down, torch.Tensor) and down.dim() == 3


def active_params(model: torch.nn.Module, config) -> int:
    """Parameters one token touches: routed experts count only for the k of E a token is sent to."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    top_k = getattr(text, "num_experts_per_tok", None) or getattr(text, "moe_top_k", None)
    inactive = 0
    for module in model.modules():
        if top_k and _expert_tensors(module):
            n_exp = module.down_proj.shape[0]
            expert_params = sum(p.numel() for p in module.parameters(recurse=False))
            inactive += expert_params * (n_exp - min(top_k, n_exp)) // n_exp
    return sum(p.numel() for p in model.parameters()) - inactive


def make_config(spec: ModelSpec, trust_remote_code: bool):
    """The config object, built from the dict the way transformers loads a config.json (`from_dict`)."""
    from transformers import CONFIG_MAPPING, AutoConfig
    # a deep copy: from_dict writes into nested dicts (transformers 5 adds rope_theta to rope_scaling), and a
    # changed spec.config keys the next build and trace of the same model apart (a second build per search)
    fields = copy.deepcopy(spec.config)
    model_type = fields.get("model_type")
    if model_type not in CONFIG_MAPPING:
        if "auto_map" in fields and not trust_remote_code:
            raise ModelError(f"model type '{model_type}' needs its own remote code; rerun with --trust-remote-code "
                             f"if you trust {spec.origin}")
        if not trust_remote_code:
            raise ModelError(f"unsupported: model type '{model_type}' is not in transformers "
                             f"{compat.transformers_version()}")
        if spec.folder is None:
            raise ModelError(f"{spec.name}: remote code needs the model's folder, not just its config")
        try:
            return AutoConfig.from_pretrained(spec.folder, trust_remote_code=True)
        except Exception as e:  # noqa: BLE001 - the remote code is the user's; report it in one line
            raise ModelError(f"cannot load remote config code from {spec.folder}: {type(e).__name__}: "
                             f"{_first_line(e)}") from None
    try:
        return CONFIG_MAPPING[model_type].from_dict(fields)
    except Exception as e:  # noqa: BLE001 - any config error is a user-facing model error
        raise ModelError(f"invalid config for model type '{model_type}': {_first_line(e)}") from None


def _first_line(e: BaseException) -> str:
    """The message's first line, and the one after it where the first only announces it (ends with ':')."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    if not lines:
        return ""
    return f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]


def model_class(config, trust_remote_code: bool):
    """(auto class, multimodal): a causal-LM class, else the image-text-to-text class whose language model we trace."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)
    model_type = getattr(config, "model_type", None)
    if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or (trust_remote_code and getattr(config, "auto_map", None)):
        return AutoModelForCausalLM, "ForConditionalGeneration" in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type, "")
    if model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        return AutoModelForImageTextToText, True
    raise ModelError(f"unsupported: model type '{model_type}' has no causal-LM or image-text-to-text class in "
                     f"transformers {compat.transformers_version()} (not a text decoder)")


def attention_implementation(auto, config) -> str:
    """tracecost's own implementation where the model dispatches attention through AttentionInterface; otherwise
    SDPA (or eager), whose attention functions are swapped for tracecost's during the traced forward."""
    try:
        cls = auto._model_mapping[type(config)]
    except Exception:  # noqa: BLE001 - remote code: let transformers decide, our implementation first
        return IMPLEMENTATION
    if getattr(cls, "_supports_attention_backend", False):
        return IMPLEMENTATION
    return "sdpa" if getattr(cls, "_supports_sdpa", False) else "eager"


def register_legacy_attention_classes(auto, config) -> None:
    """Models that pick their attention class from a dict by implementation name find tracecost's name there."""
    try:
        module = sys.modules[auto._model_mapping[type(config)].__module__]
    except Exception:  # noqa: BLE001
        return
    for name, table in vars(module).items():
        if name.endswith("ATTENTION_CLASSES") and isinstance(table, dict) and IMPLEMENTATION not in table:
            fallback = table.get("sdpa") or table.get("eager")
            if fallback is not None:
                table[IMPLEMENTATION] = fallback


def cast_legacy_float32(model: torch.nn.Module, dtype: torch.dtype) -> list[str]:
    """Parameters a modeling file makes with the legacy `torch.FloatTensor(...)` constructor (XLNet's attention
    and mask embedding) are float32 on the CPU whatever dtype and device the model is built in (HF's loading
    then keeps an existing parameter's dtype); HF's own forward mixes them with bf16 activations on meta and
    fails. They are moved to meta in the model's dtype, as `model.to(dtype)` does before serving. Parameters made
    float32 on purpose (an explicit `dtype=torch.float32`: routers, SSM decays) are left as they are. Returns
    the moved modules' class names."""
    import inspect
    cast, legacy = set(), {}
    for module in model.modules():
        cls = type(module)
        if cls not in legacy:  # one source read per class, not per module (a large model has thousands)
            try:
                legacy[cls] = "torch.FloatTensor(" in inspect.getsource(cls.__init__)
            except (OSError, TypeError):
                legacy[cls] = False
        if not legacy[cls]:
            continue
        for name, p in module.named_parameters(recurse=False):
            if p.device.type != "meta" or p.dtype != dtype:
                setattr(module, name, torch.nn.Parameter(p.to("meta", dtype), requires_grad=p.requires_grad))
                cast.add(type(module).__name__)
    return sorted(cast)


# attention modules whose causality is a config flag, not an `is_causal` attribute tracecost's attention can read:
# modeling_xlm.py / modeling_flaubert.py MultiHeadAttention (the mask follows config.causal, false by default)
_CAUSAL_FROM_CONFIG = {"MultiHeadAttention": "causal"}


def mark_causality(model: torch.nn.Module, config) -> None:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for module in model.modules():
        flag = _CAUSAL_FROM_CONFIG.get(type(module).__name__)
        if flag is not None and isinstance(getattr(text, flag, None), bool):
            module.is_causal = getattr(text, flag)


_BUILD_CACHE: OrderedDict = OrderedDict()


_EXPERT_COUNTS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")


def _check_routing(name: str, text_config) -> None:
    """A config with routed experts but no top-k (DeepSeek-V2's defaults): HF's router cannot run it either."""
    experts = next((getattr(text_config, a) for a in _EXPERT_COUNTS if getattr(text_config, a, None)), None)
    if experts and hasattr(text_config, "num_experts_per_tok") and text_config.num_experts_per_tok is None:
        raise ModelError(f"unsupported: {name}: the config has {experts} routed experts but no num_experts_per_tok "
                         f"(experts per token), so routing is undefined; set it in config.json")


def build_model(spec: ModelSpec, dtype: str = "bf16", mla_form: str = "absorbed", trust_remote_code: bool = False,
                dedup_layers: bool = True) -> BuiltModel:
    """The model on meta, with tracecost's attention and experts implementations; cached per config.

    One built model serves both dedup settings: `layers.active` switches the replay of repeated layers."""
    key = (json.dumps(spec.config, sort_keys=True), dtype, mla_form, trust_remote_code)
    if key in _BUILD_CACHE:
        _BUILD_CACHE.move_to_end(key)
        built = _BUILD_CACHE[key]
        built.layers.active = dedup_layers
        return built
    why = refusal(spec.config.get("model_type"))
    if why:
        raise ModelError(f"unsupported: {spec.name}: {why}")
    config = make_config(spec, trust_remote_code)
    if mla_form not in mla.FORMS:
        raise ModelError(f"unknown MLA form '{mla_form}' (choose from {', '.join(mla.FORMS)})")
    auto, multimodal = model_class(config, trust_remote_code)
    notes = []
    if getattr(config, "is_decoder", None) is False and not multimodal and hasattr(config, "add_cross_attention"):
        # an encoder architecture (BERT, RoBERTa, ...) used through its causal-LM class: generation needs it causal
        config.is_decoder = True
        notes.append(f"{type(config).__name__} has is_decoder=False; traced as a decoder (causal attention, KV cache), "
                     f"as its causal-LM class generates")
    _check_routing(spec.name, config.get_text_config())
    implementation = attention_implementation(auto, config)
    register_legacy_attention_classes(auto, config)
    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = auto.from_config(config, dtype=TORCH_DTYPES[dtype], attn_implementation=implementation,
                                     experts_implementation=experts.IMPLEMENTATION_NAME,
                                     trust_remote_code=trust_remote_code)
    except ModelError:
        raise
    except Exception as e:  # noqa: BLE001
        raise ModelError(f"unsupported: cannot build {spec.name} ({type(config).__name__}) on meta: "
                         f"{type(e).__name__}: {_first_line(e)}") from None
    model.eval()
    if getattr(config, "vision_config", None) is not None and not hasattr(model, "get_image_features"):
        notes.append(f"{type(model).__name__} is the text model of a vision-language config: the vision encoder's "
                     f"weights are not counted in memory (an engine serving the whole checkpoint loads them too)")
    mark_causality(model, config)
    legacy = cast_legacy_float32(model, TORCH_DTYPES[dtype])
    if legacy:
        notes.append(f"{', '.join(legacy)}: parameters HF makes with torch.FloatTensor (always float32) are "
                     f"{dtype}, as after model.to({dtype})")
    mla_modules = mla.use_absorbed_form(model) if mla_form == "absorbed" else sum(
        1 for m in model.modules() if mla.fits_absorbed_form(m))
    if any(mla.is_mla(m) and not mla.fits_absorbed_form(m) for m in model.modules()):
        notes.append("an MLA variant the absorbed (engine) form does not fit: its attention is traced as HF runs it")
    if any(attention.sparse_attention(m) and getattr(getattr(m, "config", None), "index_topk", None)
           for m in model.modules()):
        notes.append(f"DeepSeek sparse attention: each query attends to the top {config.get_text_config().index_topk} "
                     f"keys its indexer selects (priced like a window of that many keys); the indexer scores every "
                     f"cached key")
    if any(getattr(getattr(m, "config", None), "zero_expert_num", 0) for m in model.modules()):
        notes.append("zero-computation experts: every routed pick is priced as a real expert (an upper bound)")
    languages = getattr(config, "languages", None)
    if hasattr(model, "set_default_language") and languages:  # X-MOD: one language's adapters run per token
        model.set_default_language(getattr(config, "default_language", None) or languages[0])
        notes.append(f"X-MOD adapters of language {getattr(config, 'default_language', None) or languages[0]}")
    patches.replace_forwards(model)
    layers = install(model, config, dedup=True)
    if layers is None:
        raise ModelError(f"unsupported: {spec.name}: no decoder layer list found in {type(model).__name__}")
    layers.active = dedup_layers
    built = BuiltModel(model=model, config=config, num_layers=len(layers.layers), layers=layers,
                       params=sum(p.numel() for p in model.parameters()),
                       active_params=active_params(model, config), mla_modules=mla_modules,
                       attn_implementation=implementation, multimodal=multimodal, notes=notes)
    _BUILD_CACHE[key] = built
    while len(_BUILD_CACHE) > 4:
        _BUILD_CACHE.popitem(last=False)
    return built
