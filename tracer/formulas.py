"""Closed-form FLOPs per layer, written by hand from the papers and the configs, one reader per family.

These do not look at the traced graph: they read the config. Tests compare them with the tracer;
when the two disagree, one of them is wrong and the difference says where. A family reader turns a
config into `LayerShape`s (attention, recurrent mixer, MLP or experts per layer); one function counts
their FLOPs. A model type without a reader has no formula, and says so (`NoFormula`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from . import recurrent
from .attention import causal_pairs, chunked_pairs
from .work import ATTENTION, GEMM, Request


class NoFormula(ValueError):
    """No hand-written formula covers this model type (or this config of it)."""


@dataclass(frozen=True)
class Attention:
    heads: int
    kv_heads: int
    qk_dim: int
    v_dim: int
    window: int | None = None
    chunk: int | None = None
    q_gate: bool = False            # the query projection also emits an output gate (Qwen3-Next)
    mla: dict | None = None         # DeepSeek MLA dims: kv_lora_rank, q_lora_rank, qk_rope/nope_head_dim, v_head_dim


@dataclass(frozen=True)
class Mixer:
    """A recurrent mixer: projections (GEMM parameters per token) and its core (recurrent.py's formulas)."""
    kind: str                       # selective_scan | ssd | gated_delta_rule | kda | lightning | wkv
    proj_params: int                # matrix parameters every token meets
    dims: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Mlp:
    inter: int
    gated: bool = True
    experts: int = 0                # routed experts (0: dense)
    top_k: int = 0
    shared_inter: int = 0           # shared experts, total intermediate width
    shared_gate: bool = False       # a sigmoid gate (hidden -> 1) on the shared expert
    router: bool = True


@dataclass(frozen=True)
class LayerShape:
    attention: Attention | None = None
    mixer: Mixer | None = None
    mlp: Mlp | None = None


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    vocab: int
    layers: list[LayerShape]


def _get(cfg: dict, *names, default=None):
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    return default


def _text(cfg: dict) -> dict:
    return cfg.get("text_config") or cfg


# --- family readers: config dict -> ModelShape ---------------------------------------------------------------------

def standard(cfg: dict) -> ModelShape:
    """Llama-style decoders: GQA (or MLA) attention, gated MLP or routed experts (+ shared experts)."""
    n, h = cfg["num_hidden_layers"], cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    d = cfg.get("head_dim") or h // heads
    experts = _get(cfg, "num_experts", "num_local_experts", "n_routed_experts")
    first_dense = cfg.get("first_k_dense_replace", 0) or 0
    mlp_only = set(cfg.get("mlp_only_layers") or [])
    step = cfg.get("decoder_sparse_step", 1) or 1
    window = cfg.get("sliding_window")
    layer_types = cfg.get("layer_types")
    if cfg["model_type"] in ("gemma2", "gemma3_text") and not layer_types:
        layer_types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    if cfg["model_type"].startswith(("qwen2", "qwen3")) and not cfg.get("use_sliding_window"):
        window = None
    mla = None
    if cfg.get("kv_lora_rank"):
        mla = {k: cfg.get(k) for k in ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
                                       "v_head_dim")}
    layers = []
    for i in range(n):
        w = (window if layer_types[i] == "sliding_attention" else None) if layer_types else window
        attention = Attention(heads, kv_heads, d, d, window=w, mla=mla)
        dense = (not experts) or i < first_dense or i in mlp_only or (i + 1) % step != 0
        if dense:
            mlp = Mlp(cfg["intermediate_size"])
        else:
            inter = _get(cfg, "moe_intermediate_size", "intermediate_size")
            shared = (cfg.get("n_shared_experts") or 0) * inter + (cfg.get("shared_expert_intermediate_size") or 0)
            mlp = Mlp(inter, experts=experts, top_k=cfg["num_experts_per_tok"], shared_inter=shared,
                      shared_gate=bool(cfg.get("shared_expert_intermediate_size")))
        layers.append(LayerShape(attention=attention, mlp=mlp))
    return ModelShape(h, cfg["vocab_size"], layers)


def standard_plain(cfg: dict) -> ModelShape:
    """Llama-style attention with a two-matrix MLP (up, activation, down): Phi, StarCoder-2, Persimmon, Apertus,
    Arcee, nanochat, BioGPT, Jais-2."""
    shape = standard(cfg)
    return replace(shape, layers=[replace(layer, mlp=replace(layer.mlp, gated=False)) for layer in shape.layers])


def gpt2(cfg: dict) -> ModelShape:
    """GPT-2 and StarCoder-1 (GPTBigCode: multi-query), GPT-J, CodeGen: fused or separate q/k/v, 4h MLP."""
    h, heads = cfg["n_embd"], cfg["n_head"]
    kv_heads = 1 if cfg.get("multi_query") else heads
    mlp = Mlp(cfg.get("n_inner") or 4 * h, gated=False)
    attention = Attention(heads, kv_heads, h // heads, h // heads)
    return ModelShape(h, cfg["vocab_size"], [LayerShape(attention, mlp=mlp)] * cfg["n_layer"])


def gpt_neox(cfg: dict) -> ModelShape:
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    layer = LayerShape(Attention(heads, heads, h // heads, h // heads), mlp=Mlp(cfg["intermediate_size"], gated=False))
    return ModelShape(h, cfg["vocab_size"], [layer] * cfg["num_hidden_layers"])


def falcon(cfg: dict) -> ModelShape:
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    if cfg.get("new_decoder_architecture"):
        kv_heads = cfg.get("num_kv_heads") or heads
    else:
        kv_heads = 1 if cfg.get("multi_query", True) else heads
    layer = LayerShape(Attention(heads, kv_heads, h // heads, h // heads),
                       mlp=Mlp(cfg.get("ffn_hidden_size") or 4 * h, gated=False))
    return ModelShape(h, cfg["vocab_size"], [layer] * cfg["num_hidden_layers"])


def bloom(cfg: dict) -> ModelShape:
    h, heads = cfg["hidden_size"], cfg["n_head"]
    layer = LayerShape(Attention(heads, heads, h // heads, h // heads), mlp=Mlp(4 * h, gated=False))
    return ModelShape(h, cfg["vocab_size"], [layer] * cfg["n_layer"])


def mpt(cfg: dict) -> ModelShape:
    h, heads = cfg["d_model"], cfg["n_heads"]
    layer = LayerShape(Attention(heads, heads, h // heads, h // heads),
                       mlp=Mlp(cfg.get("expansion_ratio", 4) * h, gated=False))
    return ModelShape(h, cfg["vocab_size"], [layer] * cfg["n_layers"])


def dbrx(cfg: dict) -> ModelShape:
    h, heads = cfg["d_model"], cfg["n_heads"]
    attn, ffn = cfg.get("attn_config") or {}, cfg.get("ffn_config") or {}
    kv_heads = attn.get("kv_n_heads") or heads
    mlp = Mlp(ffn["ffn_hidden_size"], experts=ffn["moe_num_experts"], top_k=ffn["moe_top_k"])
    layer = LayerShape(Attention(heads, kv_heads, h // heads, h // heads), mlp=mlp)
    return ModelShape(h, cfg["vocab_size"], [layer] * cfg["n_layers"])


def gpt_neo(cfg: dict) -> ModelShape:
    h, heads = cfg["hidden_size"], cfg["num_heads"]
    mlp = Mlp(cfg.get("intermediate_size") or 4 * h, gated=False)
    layers = [LayerShape(Attention(heads, heads, h // heads, h // heads,
                                   window=cfg["window_size"] if kind == "local" else None), mlp=mlp)
              for kind in cfg["attention_layers"]]
    return ModelShape(h, cfg["vocab_size"], layers)


def opt_like(cfg: dict) -> ModelShape:
    """OPT, XGLM, Whisper's decoder (without cross-attention, which needs an encoder output): 2-matrix MLP."""
    h = _get(cfg, "hidden_size", "d_model")
    heads = _get(cfg, "num_attention_heads", "attention_heads", "decoder_attention_heads")
    n = _get(cfg, "num_hidden_layers", "num_layers", "decoder_layers")
    inter = _get(cfg, "ffn_dim", "decoder_ffn_dim")
    layer = LayerShape(Attention(heads, heads, h // heads, h // heads), mlp=Mlp(inter, gated=False))
    return ModelShape(h, cfg["vocab_size"], [layer] * n)


def llama4(cfg: dict) -> ModelShape:
    n, h = cfg["num_hidden_layers"], cfg["hidden_size"]
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // heads
    moe_layers = set(cfg.get("moe_layers") or range(cfg.get("interleave_moe_layer_step", 1) - 1, n,
                                                   cfg.get("interleave_moe_layer_step", 1)))
    chunk = cfg.get("attention_chunk_size")
    rope = cfg.get("no_rope_layers") or [1] * n
    layers = []
    for i in range(n):
        attention = Attention(heads, kv_heads, d, d, chunk=chunk if rope[i] else None)
        if i in moe_layers:
            mlp = Mlp(cfg["intermediate_size"], experts=cfg["num_local_experts"], top_k=cfg["num_experts_per_tok"],
                      shared_inter=cfg["intermediate_size"])
        else:
            mlp = Mlp(cfg["intermediate_size_mlp"])
        layers.append(LayerShape(attention, mlp=mlp))
    return ModelShape(h, cfg["vocab_size"], layers)


def qwen3_next(cfg: dict) -> ModelShape:
    """Qwen3-Next / Qwen3.5: Gated DeltaNet layers and gated full attention (q_proj also emits the gate)."""
    h = cfg["hidden_size"]
    heads, kv_heads, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    k_heads, v_heads = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    key_dim, value_dim = k_heads * dk, v_heads * dv
    proj = h * (2 * key_dim + 2 * value_dim) + h * 2 * v_heads + value_dim * h
    experts = cfg.get("num_experts") or 0
    mlp_only = set(cfg.get("mlp_only_layers") or [])
    step = cfg.get("decoder_sparse_step", 1) or 1
    layers = []
    for i, kind in enumerate(cfg["layer_types"]):
        if kind == "linear_attention":
            mixer = Mixer("gated_delta_rule", proj, {"heads": v_heads, "key_dim": dk, "value_dim": dv, "chunk": 64})
            attention = None
        else:
            mixer, attention = None, Attention(heads, kv_heads, d, d, q_gate=True)
        if experts and i not in mlp_only and (i + 1) % step == 0:
            mlp = Mlp(cfg["moe_intermediate_size"], experts=experts, top_k=cfg["num_experts_per_tok"],
                      shared_inter=cfg.get("shared_expert_intermediate_size") or 0,
                      shared_gate=bool(cfg.get("shared_expert_intermediate_size")))
        else:
            mlp = Mlp(cfg["intermediate_size"])
        layers.append(LayerShape(attention, mixer, mlp))
    return ModelShape(h, cfg["vocab_size"], layers)


def _mamba1(h: int, inner: int, states: int, rank: int) -> Mixer:
    proj = h * 2 * inner + inner * (rank + 2 * states) + rank * inner + inner * h
    return Mixer("selective_scan", proj, {"channels": inner, "states": states})


def mamba(cfg: dict) -> ModelShape:
    h = cfg["hidden_size"]
    mixer = _mamba1(h, cfg["intermediate_size"], cfg["state_size"], cfg["time_step_rank"])
    return ModelShape(h, cfg["vocab_size"], [LayerShape(mixer=mixer)] * cfg["num_hidden_layers"])


def mamba2(cfg: dict) -> ModelShape:
    h, heads, head_dim = cfg["hidden_size"], cfg["num_heads"], cfg["head_dim"]
    inner = int(cfg["expand"] * h)
    groups, states = cfg["n_groups"], cfg["state_size"]
    proj = h * (2 * inner + 2 * groups * states + heads) + inner * h
    mixer = Mixer("ssd", proj, {"heads": heads, "head_dim": head_dim, "groups": groups, "states": states,
                                "chunk": cfg["chunk_size"]})
    return ModelShape(h, cfg["vocab_size"], [LayerShape(mixer=mixer)] * cfg["num_hidden_layers"])


def jamba(cfg: dict) -> ModelShape:
    n, h = cfg["num_hidden_layers"], cfg["hidden_size"]
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    inner = cfg["mamba_expand"] * h
    rank = cfg["mamba_dt_rank"] if cfg["mamba_dt_rank"] != "auto" else -(-h // 16)
    layers = []
    for i in range(n):
        is_attention = i % cfg["attn_layer_period"] == cfg["attn_layer_offset"]
        is_moe = i % cfg["expert_layer_period"] == cfg["expert_layer_offset"]
        mlp = (Mlp(cfg["intermediate_size"], experts=cfg["num_experts"], top_k=cfg["num_experts_per_tok"])
               if is_moe and cfg["num_experts"] > 1 else Mlp(cfg["intermediate_size"]))
        if is_attention:
            layers.append(LayerShape(Attention(heads, kv_heads, h // heads, h // heads), mlp=mlp))
        else:
            layers.append(LayerShape(mixer=_mamba1(h, inner, cfg["mamba_d_state"], rank), mlp=mlp))
    return ModelShape(h, cfg["vocab_size"], layers)


FAMILIES = {
    **{t: standard for t in (
        "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text",
        "deepseek_v2", "deepseek_v3", "gpt_oss", "phi3", "olmo2", "olmo3", "granite", "helium", "ministral",
        "qwen2_5_vl_text", "qwen2_vl_text", "qwen3_vl_text", "qwen3_vl_moe_text", "bitnet", "cohere", "cohere2",
        "cohere2_moe", "cwm", "emu3", "ernie4_5", "ernie4_5_moe", "exaone4", "flex_olmo", "glm", "glm4", "glm4_moe",
        "glm4_moe_lite", "granite_swa", "granitemoe", "granitemoe_swa", "granitemoeshared", "hyperclovax", "mellum",
        "minicpm3", "minimax_m2", "ministral3", "olmo", "olmoe", "phimoe", "seed_oss", "smollm3", "solar_open",
        "stablelm", "vaultgemma", "youtu")},
    **{t: standard_plain for t in ("phi", "starcoder2", "persimmon", "apertus", "arcee", "nanochat", "biogpt",
                                   "jais2")},
    "gpt2": gpt2, "gpt_bigcode": gpt2, "gptj": gpt2, "codegen": gpt2,
    "gpt_neox": gpt_neox, "falcon": falcon, "bloom": bloom, "mpt": mpt, "dbrx": dbrx, "gpt_neo": gpt_neo,
    "opt": opt_like, "xglm": opt_like, "whisper": opt_like,
    "llama4_text": llama4, "llama4": llama4, "qwen3_5": qwen3_next, "qwen3_5_moe": qwen3_next,
    "qwen3_next": qwen3_next, "qwen3_5_text": qwen3_next, "qwen3_5_moe_text": qwen3_next,
    "mamba": mamba, "falcon_mamba": mamba, "mamba2": mamba2, "jamba": jamba,
}


# vision-language wrappers whose language model is a plain causal decoder of a family above (PaliGemma is not:
# its prefix attends bidirectionally)
VLM_WRAPPERS = {"llava", "llava_next", "mistral3", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "llama4",
                "gemma3", "aya_vision", "internvl", "lighton_ocr", "got_ocr2", "fuyu"}


def model_shape(cfg: dict) -> ModelShape:
    text = _text(cfg)
    reader = FAMILIES.get(cfg.get("model_type"))
    if reader is None and text is not cfg and cfg.get("model_type") in VLM_WRAPPERS:
        reader = FAMILIES.get(text.get("model_type"))
    if reader is None:
        raise NoFormula(f"no hand-written formula covers model type '{cfg.get('model_type')}'")
    try:
        return reader(text)
    except (KeyError, TypeError) as e:
        raise NoFormula(f"the formula for '{cfg.get('model_type')}' does not cover this config "
                        f"(missing {e})") from None


# --- counting --------------------------------------------------------------------------------------------------------

def _attention_flops(a: Attention, h: int, b: int, q: int, c: int, mla_form: str) -> tuple[float, float]:
    t = b * q
    if a.mla:
        latent, rope, nope, v = (a.mla["kv_lora_rank"], a.mla["qk_rope_head_dim"], a.mla["qk_nope_head_dim"],
                                 a.mla["v_head_dim"])
        q_lora = a.mla.get("q_lora_rank")
        gemm = 2 * t * (h * q_lora + q_lora * a.heads * (nope + rope)) if q_lora else 2 * t * h * a.heads * (nope + rope)
        gemm += 2 * t * h * (latent + rope) + 2 * t * a.heads * v * h
        pairs = causal_pairs(q, c)
        if mla_form == "absorbed":
            gemm += 2 * t * a.heads * nope * latent + 2 * t * a.heads * latent * v
            return gemm, 2.0 * b * a.heads * pairs * ((latent + rope) + latent)
        gemm += 2 * b * (c + q) * latent * a.heads * (nope + v)
        return gemm, 2.0 * b * a.heads * pairs * ((nope + rope) + v)
    q_out = a.heads * a.qk_dim * (2 if a.q_gate else 1)
    gemm = 2 * t * h * (q_out + a.kv_heads * (a.qk_dim + a.v_dim)) + 2 * t * a.heads * a.v_dim * h
    pairs = chunked_pairs(q, c, a.chunk) if a.chunk else causal_pairs(q, c, a.window)
    return gemm, 2.0 * b * a.heads * pairs * (a.qk_dim + a.v_dim)


def _mixer_flops(m: Mixer, b: int, q: int) -> tuple[float, float]:
    d = m.dims
    gemm = 2.0 * b * q * m.proj_params
    if m.kind == "selective_scan":
        core = recurrent.selective_scan_flops(q, d["channels"], d["states"])
    elif m.kind == "ssd":
        core = sum(recurrent.ssd_flops(q, d["heads"], d["head_dim"], d["groups"], d["states"], d["chunk"]))
    elif m.kind in ("gated_delta_rule", "kda"):
        core = sum(recurrent.delta_rule_flops(q, d["heads"], d["key_dim"], d["value_dim"], d["chunk"],
                                              m.kind == "kda"))
    else:
        raise NoFormula(f"no formula for the {m.kind} mixer")
    return gemm, b * core


def _mlp_flops(m: Mlp, h: int, t: int) -> float:
    width = 3 if m.gated else 2
    if not m.experts:
        return 2.0 * t * h * m.inter * width
    flops = 2.0 * t * m.top_k * h * m.inter * width + 2.0 * t * h * m.shared_inter * 3
    flops += 2.0 * t * h * m.experts if m.router else 0.0
    return flops + (2.0 * t * h if m.shared_gate else 0.0)


def layer_flops(shape: ModelShape, layer: LayerShape, request: Request, mla_form: str = "absorbed") -> dict:
    b, q, c = request.num_queries, request.query_length, request.context_length
    gemm = attention = 0.0
    if layer.attention is not None:
        g, a = _attention_flops(layer.attention, shape.hidden, b, q, c, mla_form)
        gemm, attention = gemm + g, attention + a
    if layer.mixer is not None:
        g, a = _mixer_flops(layer.mixer, b, q)
        gemm, attention = gemm + g, attention + a
    if layer.mlp is not None:
        gemm += _mlp_flops(layer.mlp, shape.hidden, b * q)
    return {GEMM: gemm, ATTENTION: attention}


def model_flops(cfg: dict, request: Request, mla_form: str = "absorbed") -> dict[str, float]:
    """Matrix FLOPs of one forward step by class, LM head included (last token per sequence unless all logits).
    Recurrent mixers' cores count in the attention class, as in the trace."""
    shape = model_shape(cfg)
    total = {GEMM: 0.0, ATTENTION: 0.0}
    for layer in shape.layers:
        for k, v in layer_flops(shape, layer, request, mla_form).items():
            total[k] += v
    logits_rows = request.tokens if request.all_logits else request.num_queries
    total[GEMM] += 2 * logits_rows * shape.hidden * shape.vocab
    return total


def full_config(spec) -> dict:
    """The config with transformers' defaults filled in, as the model was built from (needs transformers)."""
    from .build import make_config
    return make_config(spec, trust_remote_code=False).to_dict()
