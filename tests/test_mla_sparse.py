"""DeepSeek sparse attention (V3.2) in the engines' form: absorbed MLA over the latent cache, reading the top
index_topk keys its indexer picks, beside the indexer's own key cache and its scores over every cached key."""
import json

import pytest

from tracer import Request, TraceOptions, resolve_model, trace

LAYERS = 4


@pytest.fixture(scope="module")
def v32(tmp_path_factory):
    config = dict(resolve_model("deepseek-v3").config)
    config.update(architectures=["DeepseekV32ForCausalLM"], model_type="deepseek_v32", num_hidden_layers=LAYERS,
                  index_n_heads=64, index_head_dim=128, index_topk=2048)
    config.pop("quantization_config", None)
    folder = tmp_path_factory.mktemp("deepseek-v32")
    (folder / "config.json").write_text(json.dumps(config))
    return resolve_model(str(folder))


def _attention(t, indexer: bool):
    return [op for op in t.ops if op.attention is not None and ("indexer" in op.module) == indexer]


def test_v32_runs_absorbed_with_the_indexer_beside_it(v32):
    c = v32.config
    t = trace(v32, Request(2, 1, 8000, decode=True))
    assert not any("does not fit" in n for n in t.notes)
    # the cache holds the latent (kv_lora_rank + rope) and the indexer's key (index_head_dim), per layer per token
    assert t.kv_bytes_per_token == LAYERS * (c["kv_lora_rank"] + c["qk_rope_head_dim"] + c["index_head_dim"]) * 2
    main, scores = _attention(t, False), _attention(t, True)
    assert main and scores
    # the attention reads the top 2048 of the 8001 keys; the indexer scores all of them, 64 heads of 128 dims and a
    # weighted sum over the heads
    assert {op.attention.window for op in main} == {2048}
    # sparse attention prefills in the latent form too: no expanded head dims for the engine pricing to pick
    assert all(op.attention.expanded_head_dims is None for op in main)
    # the indexer runs whole on every tensor-parallel rank (the engines' ReplicatedLinear, all 64 heads)
    assert all(not op.tp_sharded for op in t.ops if "indexer" in op.module)
    per_layer = 2 * 2 * 64 * 8001 * (128 + 1)
    assert sum(op.flops * op.count for op in scores) == pytest.approx(LAYERS * per_layer, rel=1e-6)
    dense = trace("deepseek-v3", Request(2, 1, 8000, decode=True))
    dense_layers = resolve_model("deepseek-v3").config["num_hidden_layers"]
    ratio = (sum(op.flops * op.count for op in main) / LAYERS) / (
        sum(op.flops * op.count for op in _attention(dense, False)) / dense_layers)
    assert ratio == pytest.approx(2048 / 8001, rel=0.01)


def test_v32_hf_form_still_caches_the_expanded_keys_and_values(v32):
    c = v32.config
    hf = trace(v32, Request(1, 1, 1000, decode=True), TraceOptions(mla_form="hf"))
    absorbed = trace(v32, Request(1, 1, 1000, decode=True))
    expanded = c["num_attention_heads"] * (c["qk_nope_head_dim"] + c["qk_rope_head_dim"] + c["v_head_dim"])
    assert hf.kv_bytes_per_token >= LAYERS * expanded * 2 > 10 * absorbed.kv_bytes_per_token


def test_v32_indexer_elementwise_fuses_as_an_engine_runs_it(v32):
    t = trace(v32, Request(8, 1, 1000, decode=True))
    loose = [op for op in t.ops if "indexer" in op.module and op.op_class == "other" and not op.kv_cache_write
             and op.fusion_key is None]
    assert not loose, [op.name for op in loose]


def test_bundled_v32_is_v3_with_the_published_indexer_and_prices_its_rows():
    from serving.published_rows import MODELS
    v3, v32 = resolve_model("deepseek-v3").config, resolve_model("deepseek-v3.2").config
    assert (v32["index_n_heads"], v32["index_head_dim"], v32["index_topk"]) == (64, 128, 2048)
    assert {k: v for k, v in v32.items() if not k.startswith("index_") and k not in ("architectures", "model_type")} \
        == {k: v for k, v in v3.items() if k not in ("architectures", "model_type")}
    assert MODELS["deepseek-ai/DeepSeek-V3.2"] == "deepseek-v3.2"
    t = trace("deepseek-v3.2", Request(1, 1, 4096, decode=True))
    assert t.kv_bytes_per_token == 61 * (512 + 64 + 128) * 2


def test_glm5_shared_layers_reuse_the_last_indexers_picks(tmp_path):
    """GLM-5 (glm_moe_dsa): 'shared' layers run no indexer and cache no indexer key; every layer's absorbed
    attention reads 2048 keys."""
    from transformers import AutoConfig
    kinds = ["full", "full", "shared", "shared", "full", "shared"]
    config = AutoConfig.for_model("glm_moe_dsa", num_hidden_layers=len(kinds), first_k_dense_replace=1,
                                  indexer_types=kinds).to_dict()
    (tmp_path / "config.json").write_text(json.dumps(config))
    t = trace(resolve_model(str(tmp_path)), Request(1, 1, 6000, decode=True))
    assert not any("does not fit" in n for n in t.notes)
    full = kinds.count("full")
    assert sum(op.count for op in _attention(t, True)) == full
    assert sum(op.count for op in _attention(t, False)) == len(kinds)
    assert {op.attention.window for op in _attention(t, False)} == {2048}
    latent = config["kv_lora_rank"] + config["qk_rope_head_dim"]
    assert t.kv_bytes_per_token == (len(kinds) * latent + full * config["index_head_dim"]) * 2
