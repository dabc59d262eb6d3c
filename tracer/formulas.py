"""Closed-form FLOPs per layer for the dense, MoE and MLA families, written by hand from the papers.

These do not look at the traced graph: they read the config. Tests compare them with the tracer;
when the two disagree, one of them is wrong and the difference says where.
"""
from __future__ import annotations

from dataclasses import dataclass

from .attention import causal_pairs
from .work import ATTENTION, GEMM, Request


@dataclass(frozen=True)
class LayerShape:
    dense_mlp: bool
    window: int | None


def _get(cfg: dict, *names, default=None):
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    return default


def _layers(cfg: dict) -> list[LayerShape]:
    n = cfg["num_hidden_layers"]
    experts = _get(cfg, "num_experts", "num_local_experts", "n_routed_experts")
    first_dense = cfg.get("first_k_dense_replace", 0)
    mlp_only = set(cfg.get("mlp_only_layers") or [])
    step = cfg.get("decoder_sparse_step", 1) or 1
    window = cfg.get("sliding_window")
    layer_types = cfg.get("layer_types")
    if cfg["model_type"] in ("gemma2", "gemma3_text") and not layer_types:
        layer_types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    if cfg["model_type"] in ("qwen2", "qwen3", "qwen3_moe") and not cfg.get("use_sliding_window"):
        window = None
    shapes = []
    for i in range(n):
        dense = (not experts) or i < first_dense or i in mlp_only or (i + 1) % step != 0
        if layer_types:
            w = window if layer_types[i] == "sliding_attention" else None
        else:
            w = window
        shapes.append(LayerShape(dense_mlp=dense, window=w))
    return shapes


def layer_flops(cfg: dict, request: Request, layer: LayerShape, mla_form: str = "absorbed") -> dict[str, float]:
    b, q, c = request.num_queries, request.query_length, request.context_length
    t = b * q
    h = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    pairs = causal_pairs(q, c, layer.window)
    gemm = 0.0
    if cfg.get("kv_lora_rank"):  # MLA
        latent, rope, nope, v = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
        q_lora = cfg.get("q_lora_rank")
        gemm += 2 * t * (h * q_lora + q_lora * heads * (nope + rope)) if q_lora else 2 * t * h * heads * (nope + rope)
        gemm += 2 * t * h * (latent + rope)
        gemm += 2 * t * heads * v * h  # o_proj
        if mla_form == "absorbed":
            gemm += 2 * t * heads * nope * latent + 2 * t * heads * latent * v
            attention = 2.0 * b * heads * pairs * ((latent + rope) + latent)
        else:
            gemm += 2 * b * (c + q) * latent * heads * (nope + v)  # re-expand the whole latent cache
            attention = 2.0 * b * heads * pairs * ((nope + rope) + v)
    else:
        d = cfg.get("head_dim") or h // heads
        gemm += 2 * t * h * (heads + 2 * kv_heads) * d + 2 * t * heads * d * h
        attention = 2.0 * b * heads * pairs * 2 * d
    if layer.dense_mlp:
        gemm += 2 * t * h * cfg["intermediate_size"] * 3
    else:
        experts = _get(cfg, "num_experts", "num_local_experts", "n_routed_experts")
        k = cfg["num_experts_per_tok"]
        inter = _get(cfg, "moe_intermediate_size", "intermediate_size")
        gemm += 2 * t * h * experts  # router
        gemm += 2 * t * k * h * inter * 3
        shared = cfg.get("n_shared_experts") or 0
        gemm += 2 * t * h * inter * shared * 3
        if cfg.get("shared_expert_intermediate_size"):
            gemm += 2 * t * h * cfg["shared_expert_intermediate_size"] * 3 + 2 * t * h
    return {GEMM: gemm, ATTENTION: attention}


def model_flops(cfg: dict, request: Request, mla_form: str = "absorbed") -> dict[str, float]:
    """Matrix FLOPs of one forward step by class, LM head included (last token per sequence unless all logits)."""
    total = {GEMM: 0.0, ATTENTION: 0.0}
    for layer in _layers(cfg):
        for k, v in layer_flops(cfg, request, layer, mla_form).items():
            total[k] += v
    logits_rows = request.tokens if request.all_logits else request.num_queries
    total[GEMM] += 2 * logits_rows * cfg["hidden_size"] * cfg["vocab_size"]
    return total
