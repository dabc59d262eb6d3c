import json

import pytest

from tracer import ModelError, Request, TraceOptions, resolve_model, trace
from tracer.__main__ import main as tracer_main
from tracer.attention import causal_pairs, keys_read
from tracer.experts import expected_active_experts
from tracer.formulas import model_flops

# (model, request) pairs spanning dense GQA, sliding window, MoE and MLA, prefill and decode, with and without context
CROSSCHECK = [
    (m, r) for m in ("llama-3.1-8b", "qwen2.5-7b", "gemma-2-9b", "mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v2-lite",
                     "deepseek-v3", "gpt-oss-20b")
    for r in (Request(1, 512, 0), Request(2, 300, 5000), Request(16, 1, 8192, decode=True))
]


@pytest.mark.parametrize("model,request_", CROSSCHECK)
def test_traced_flops_match_hand_formulas(model, request_):
    t = trace(model, request_)
    formula = model_flops(resolve_model(model).config, request_)
    traced = t.flops_by_class()
    for cls in ("gemm", "attention"):
        assert traced[cls] == pytest.approx(formula[cls], rel=0.005), cls
    assert t.flops == pytest.approx(formula["gemm"] + formula["attention"], rel=0.005)


def test_mla_hf_form_matches_its_formula_and_reexpands_the_cache():
    req = Request(4, 1, 4096, decode=True)
    hf = trace("deepseek-v2-lite", req, TraceOptions(mla_form="hf"))
    absorbed = trace("deepseek-v2-lite", req)
    formula = model_flops(resolve_model("deepseek-v2-lite").config, req, "hf")
    assert hf.flops_by_class()["gemm"] == pytest.approx(formula["gemm"], rel=0.005)
    # re-expanding 4097 cached tokens through kv_b_proj dwarfs the absorbed form's GEMMs
    assert hf.flops_by_class()["gemm"] > 10 * absorbed.flops_by_class()["gemm"]
    # both cache the latent: kv_lora_rank + rope dims per layer per token
    cfg = resolve_model("deepseek-v2-lite").config
    per_token = cfg["num_hidden_layers"] * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * 2
    assert absorbed.kv_bytes_per_token == per_token == hf.kv_bytes_per_token


@pytest.mark.parametrize("model", ["llama-3.2-1b", "gemma-2-9b", "qwen3-30b-a3b", "deepseek-v2-lite"])
def test_identical_layers_traced_once_equal_full_trace(model):
    req = Request(2, 64, 128)
    dedup = trace(model, req)
    full = trace(model, req, TraceOptions(dedup_layers=False))
    assert dedup.num_ops == full.num_ops
    for cls in ("gemm", "attention", "other"):
        assert dedup.flops_by_class()[cls] == pytest.approx(full.flops_by_class()[cls], rel=1e-9)
        assert dedup.bytes_by_class()[cls] == pytest.approx(full.bytes_by_class()[cls], rel=1e-9)
    assert len(dedup.ops) < len(full.ops)


def test_causal_pairs_closed_form():
    assert causal_pairs(4, 0) == 1 + 2 + 3 + 4
    assert causal_pairs(3, 10) == 11 + 12 + 13
    assert causal_pairs(1, 1000) == 1001
    # window of 3 keys: min(C + i + 1, 3)
    assert causal_pairs(5, 0, window=3) == 1 + 2 + 3 + 3 + 3
    assert causal_pairs(2, 100, window=50) == 100
    for q, c, w in [(7, 3, 4), (50, 0, 16), (9, 20, 25), (1, 0, 1)]:
        assert causal_pairs(q, c, w) == sum(min(c + i + 1, w) for i in range(q))
    assert keys_read(4, 100) == 104 and keys_read(4, 100, window=10) == 13


def test_attention_op_work_gqa_and_window():
    t = trace("gemma-2-9b", Request(1, 1, 10000, decode=True))
    attn = [op for op in t.ops if op.attention is not None]
    windows = {op.attention.window for op in attn}
    assert windows == {None, 4096}
    for op in attn:
        w = op.attention
        keys = 10001 if w.window is None else 4096
        assert w.pairs_per_sequence == keys
        assert op.flops == 4 * w.heads * w.qk_head_dim * keys
        # K and V read once per KV head (8), never repeated to the 16 query heads
        kv = 2 * w.kv_heads * keys * w.qk_head_dim * 2
        q_and_o = 2 * w.heads * w.qk_head_dim * 2
        assert op.bytes == kv + q_and_o


def test_attention_sinks_and_short_window():
    t = trace("gpt-oss-20b", Request(1, 300, 1000))
    attn = [op for op in t.ops if op.attention is not None]
    assert all(op.attention.has_sinks for op in attn)
    sliding = next(op for op in attn if op.attention.window == 128)
    assert sliding.attention.pairs_per_sequence == 300 * 128
    assert sliding.attention.kv_tokens_read == 128 + 300 - 1
    # one sink logit per head is read (fp32) on top of Q, K, V
    w = sliding.attention
    qkv = (w.heads * 300 * 64 + 2 * w.kv_heads * w.kv_tokens_read * 64) * 2
    assert sliding.bytes_read == qkv + w.heads * 4


def test_kv_cache_write_counts_new_tokens_only():
    req = Request(2, 10, 5000)
    t = trace("llama-3.1-8b", req)
    writes = [op for op in t.ops if op.kv_cache_write]
    assert sum(op.bytes_written * op.count for op in writes) == 2 * 10 * 32 * 2 * 8 * 128 * 2
    # no op touches a tensor as long as the whole cache (no DynamicCache-style concatenation)
    assert not any(op.name == "aten.cat" and any(5010 in s for s in op.shapes) for op in t.ops)


def test_embedding_reads_only_gathered_rows_and_logits_for_last_token():
    t = trace("llama-3.1-8b", Request(3, 7, 0))
    emb = next(op for op in t.ops if op.name == "aten.embedding")
    assert emb.bytes_read == 3 * 7 * (4096 * 2 + 8)
    head = [op for op in t.ops if "lm_head" in op.module]
    assert head and head[0].gemm.m == 3
    all_logits = trace("llama-3.1-8b", Request(3, 7, 0, all_logits=True))
    assert next(op for op in all_logits.ops if "lm_head" in op.module).gemm.m == 21


def test_moe_expected_routing():
    assert expected_active_experts(1, 128, 8) == pytest.approx(8)
    assert expected_active_experts(10000, 128, 8) == pytest.approx(128)
    t = trace("qwen3-30b-a3b", Request(1, 1, 100, decode=True))
    experts = [op for op in t.ops if op.experts is not None]
    assert len(experts) == 1 and experts[0].count == 48  # one op per layer, traced once
    w = experts[0].experts
    assert experts[0].weight_bytes == pytest.approx(8 * 3 * 2048 * 768 * 2)
    assert experts[0].flops == 2 * 1 * 8 * 2048 * 768 * 3
    assert w.tokens_per_expert == pytest.approx(8 / 128)
    imbalanced = trace("qwen3-30b-a3b", Request(1, 1, 100, decode=True), TraceOptions(moe_imbalance=2.0))
    assert next(op for op in imbalanced.ops if op.experts).experts.imbalance == 2.0
    assert 2.5e9 < t.active_params < 4.0e9 < 30e9 < t.params


def test_fp8_weights_halve_gemm_weight_bytes():
    bf16 = trace("llama-3.2-1b", Request(1, 1, 10, decode=True))
    fp8 = trace("llama-3.2-1b", Request(1, 1, 10, decode=True), TraceOptions(dtype="fp8"))
    # every linear layer at one byte; lm_head stays bf16, as transformers and vLLM keep the output embedding
    w16 = sum(op.weight_bytes * op.count for op in bf16.ops if op.op_class == "gemm" and op.module != "lm_head")
    w8 = sum(op.weight_bytes * op.count for op in fp8.ops if op.op_class == "gemm" and op.module != "lm_head")
    assert w8 == pytest.approx(w16 / 2)
    linear = [op for op in fp8.ops if op.op_class == "gemm" and op.weight_operand == "param" and op.module != "lm_head"]
    assert linear and all(op.dtype == "fp8" and op.weight_format == "fp8" for op in linear)
    # a GEMM of two activations (the rotary table) has no weight to quantize
    assert all(op.weight_format is None and op.dtype != "fp8" for op in fp8.ops
               if op.op_class == "gemm" and op.weight_operand != "param")
    head = next(op for op in fp8.ops if op.module == "lm_head")
    assert (head.dtype, head.weight_format, head.weight_role) == ("bf16", "bf16", "lm_head")


def test_no_unformulated_matrix_ops_in_bundled_models():
    for model in ("llama-3.1-8b", "qwen3-30b-a3b", "deepseek-v3", "gemma-2-9b"):
        assert trace(model, Request(1, 16, 16)).unformulated == {}


def test_model_sources(tmp_path):
    cfg = resolve_model("llama-3.2-1b").config
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    from_dir = trace(str(tmp_path), Request(1, 8, 0))
    from_file = trace(str(tmp_path / "config.json"), Request(1, 8, 0))
    assert from_dir.flops == from_file.flops == trace("llama-3.2-1b", Request(1, 8, 0)).flops
    with pytest.raises(ModelError, match="not in the local Hugging Face cache"):
        resolve_model("someone/not-downloaded-model")
    custom = dict(cfg, model_type="my_custom_arch", auto_map={"AutoConfig": "x.Y"})
    (tmp_path / "config.json").write_text(json.dumps(custom))
    with pytest.raises(ModelError, match="--trust-remote-code"):
        trace(str(tmp_path), Request(1, 8, 0))


def test_tracer_cli_json(capsys):
    assert tracer_main(["qwen3-30b-a3b", "-b", "2", "-q", "64", "-c", "32", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("params", "active_params", "flops", "flops_by_class", "bytes", "bytes_by_class", "num_ops",
                "trace_seconds"):
        assert key in out
    assert set(out["flops_by_class"]) == {"gemm", "attention", "other"}
    assert out["flops"] == pytest.approx(sum(out["flops_by_class"].values()))
    assert out["architecture"] == "Qwen3MoeForCausalLM"


def test_tracer_cli_bad_input(capsys):
    assert tracer_main(["no-such-model"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1
    assert tracer_main(["llama-3.2-1b", "-q", "0"]) == 2
    assert tracer_main(["--list"]) == 0
    assert "deepseek-v3" in capsys.readouterr().out


def test_untested_transformers_release_is_refused(monkeypatch):
    import transformers

    from tracer import compat
    monkeypatch.delenv(compat.OVERRIDE_ENV, raising=False)
    monkeypatch.setattr(transformers, "__version__", "6.0.0")
    with pytest.raises(ModelError, match="outside the tested range"):
        compat.check_versions()
    monkeypatch.setenv(compat.OVERRIDE_ENV, "1")
    compat.check_versions()
    monkeypatch.delenv(compat.OVERRIDE_ENV)
    monkeypatch.setattr(transformers, "__version__", "5.20.1")
    compat.check_versions()


def test_quantization_config_sets_the_weight_format(tmp_path):
    from tracer.model_source import config_weight_dtype
    cfg = resolve_model("llama-3.2-1b").config
    assert config_weight_dtype(cfg) is None
    assert config_weight_dtype({"quantization_config": {"quant_method": "fp8", "fmt": "e4m3"}}) == "fp8"
    assert config_weight_dtype({"quantization_config": {"quant_method": "awq", "bits": 4}}) == "int4"
    assert config_weight_dtype({"quantization_config": {"quant_method": "nvfp4"}}) == "fp4"
    assert config_weight_dtype({"quantization_config": {"quant_method": "mxfp4"}}) == "mxfp4"
    (tmp_path / "config.json").write_text(json.dumps(dict(cfg, quantization_config={"quant_method": "fp8"})))
    req = Request(1, 1, 64, decode=True)
    auto, bf16 = trace(str(tmp_path), req), trace(str(tmp_path), req, TraceOptions(dtype="bf16"))
    # linear layers at one byte; the (tied) embedding and the norms stay bf16: one more byte each
    unquantized = cfg["vocab_size"] * cfg["hidden_size"] + (2 * cfg["num_hidden_layers"] + 1) * cfg["hidden_size"]
    assert auto.options.dtype == "fp8" and auto.weight_bytes == pytest.approx(bf16.weight_bytes / 2 + unquantized)
    assert any("quantization_config" in n for n in auto.notes)
    (tmp_path / "config.json").write_text(json.dumps(dict(cfg, quantization_config={"quant_method": "gptq",
                                                                                     "bits": 4})))
    w4 = trace(str(tmp_path), req)
    assert {op.dtype for op in w4.ops if op.weight_format is not None} == {"bf16"}  # dequantized to bf16 for the GEMM
    assert {op.weight_format for op in w4.ops if op.weight_role == "linear"} == {"int4"}


def test_disk_cache_skips_torch_on_a_repeat(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path
    code = ("import sys; from tracer import trace, Request; t = trace('llama-3.2-1b', Request(1, 8, 0)); "
            "print('torch' in sys.modules, t.flops, t.num_ops)")
    env = dict(os.environ, TRACECOST_CACHE_DIR=str(tmp_path), PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    env.pop("TRACECOST_NO_CACHE", None)
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert first.stdout.split()[0] == "True" and second.stdout.split()[0] == "False"
    assert first.stdout.split()[1:] == second.stdout.split()[1:]
    assert len(list((tmp_path / "traces").glob("*.pkl"))) == 1
    env["TRACECOST_NO_CACHE"] = "1"
    third = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert third.stdout.split()[0] == "True"


def test_hf_id_from_the_local_cache(tmp_path, monkeypatch):
    snapshot = tmp_path / "models--acme--tiny-llama" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(resolve_model("llama-3.2-1b").config))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    spec = resolve_model("acme/tiny-llama")
    assert spec.name == "acme/tiny-llama" and spec.folder == str(snapshot)
    assert trace(spec, Request(1, 4, 0)).params == trace("llama-3.2-1b", Request(1, 4, 0)).params


def test_remote_code_runs_only_with_the_flag(tmp_path):
    cfg = dict(resolve_model("llama-3.2-1b").config, model_type="acme_llama",
               auto_map={"AutoConfig": "configuration_acme.AcmeConfig"})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    marker = tmp_path / "ran.txt"
    (tmp_path / "configuration_acme.py").write_text(
        "from pathlib import Path\nfrom transformers import LlamaConfig\n"
        f"Path({str(marker)!r}).write_text('ran')\n"
        "class AcmeConfig(LlamaConfig):\n    model_type = 'acme_llama'\n")
    with pytest.raises(ModelError, match="--trust-remote-code"):
        trace(str(tmp_path), Request(1, 4, 0))
    assert not marker.exists()
    try:
        trace(str(tmp_path), Request(1, 4, 0), TraceOptions(trust_remote_code=True))
    except ModelError:
        pass  # building the model may still need modeling code this folder lacks; the config code ran
    assert marker.exists()


def test_tracing_leaves_the_config_as_given_and_builds_once():
    """transformers' from_dict writes into nested config dicts (rope_scaling); the spec's own config must not change,
    or the next trace of the same model builds it again and keys its traces apart."""
    import copy

    from tracer import build
    spec = resolve_model("llama-3.1-8b")
    assert spec.config.get("rope_scaling")                   # the nested dict transformers rewrites
    given = copy.deepcopy(spec.config)
    trace(spec, Request(1, 1, 7, decode=True))
    builds = len(build._BUILD_CACHE)
    trace(spec, Request(1, 7, 0))
    assert spec.config == given and len(build._BUILD_CACHE) == builds
