"""One tiny model per architecture family the tracer covers, and the checks that keep a wrong number from passing.

Configs are written by transformers itself (`to_json_file`), as a user's config.json would be.
"""
import json

import pytest

from tracer import ModelError, Request, TraceOptions, resolve_model, trace
from tracer.__main__ import main as tracer_main
from tracer.attention import causal_pairs, chunked_pairs
from tracer.formulas import NoFormula, full_config, model_flops
from tracer.recurrent import chunk_pairs

PREFILL, DECODE = Request(2, 16, 24), Request(2, 1, 40, decode=True)

TINY = {
    "gpt2": dict(n_embd=64, n_layer=3, n_head=4, vocab_size=100),
    "gpt_bigcode": dict(n_embd=64, n_layer=3, n_head=4, vocab_size=100, multi_query=True),
    "falcon": dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, vocab_size=100),
    "gpt_neox": dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=128,
                     vocab_size=100),
    "bloom": dict(hidden_size=64, n_layer=3, n_head=4, vocab_size=100),
    "phi3": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=100, pad_token_id=0, eos_token_id=1, bos_token_id=1),
    "dbrx": dict(d_model=64, n_heads=4, n_layers=2, vocab_size=100, max_seq_len=256,
                 attn_config={"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
                 ffn_config={"ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2}),
    "llama4_text": dict(hidden_size=64, intermediate_size=32, intermediate_size_mlp=128, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                        num_experts_per_tok=1, vocab_size=100, attention_chunk_size=16),
    "qwen3_next": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                       linear_key_head_dim=16, linear_value_head_dim=16, num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=32, shared_expert_intermediate_size=32, vocab_size=100),
    "jamba": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, attn_layer_period=2,
                  attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1, mamba_d_state=8,
                  mamba_dt_rank=8, vocab_size=100),
    "mamba": dict(hidden_size=64, intermediate_size=128, state_size=8, time_step_rank=8, num_hidden_layers=2,
                  vocab_size=100),
    "mamba2": dict(hidden_size=64, num_heads=8, head_dim=16, n_groups=2, state_size=16, num_hidden_layers=2,
                   vocab_size=100, chunk_size=8),
}
# families with a hand-written formula; the others must say there is none
NO_FORMULA = {"rwkv", "kimi_linear", "minimax"}
TINY.update({
    "rwkv": dict(hidden_size=64, attention_hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 vocab_size=100),
    "kimi_linear": dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=4, num_experts=4, num_experts_per_token=2,
                        kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
                        linear_attn_config={"kda_layers": [1], "full_attn_layers": [2], "num_heads": 4,
                                            "head_dim": 16, "short_conv_kernel_size": 4},
                        vocab_size=100, pad_token_id=0, bos_token_id=1, eos_token_id=1),
    "minimax": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, block_size=8,
                    layer_types=["linear_attention", "full_attention"], vocab_size=100),
})


def tiny(tmp_path, model_type: str, **overrides) -> str:
    from transformers import AutoConfig
    folder = tmp_path / model_type
    folder.mkdir(exist_ok=True)
    AutoConfig.for_model(model_type, **{**TINY.get(model_type, {}), **overrides}).to_json_file(
        str(folder / "config.json"))
    return str(folder)


def _assert_checks(t):
    assert t.checks["flop_identity"].startswith("holds"), t.checks
    assert t.checks["cache"].startswith("every attention op")


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_family_traces_with_checks_and_formula(tmp_path, model_type):
    spec = resolve_model(tiny(tmp_path, model_type))
    for req in (PREFILL, DECODE):
        t = trace(spec, req)
        _assert_checks(t)
        full = trace(spec, req, TraceOptions(dedup_layers=False))
        for cls in ("gemm", "attention", "other"):
            assert t.flops_by_class()[cls] == pytest.approx(full.flops_by_class()[cls], rel=1e-9), cls
        if model_type in NO_FORMULA:
            with pytest.raises(NoFormula, match="no hand-written formula"):
                model_flops(full_config(spec), req)
            continue
        formula = model_flops(full_config(spec), req)
        for cls in ("gemm", "attention"):
            assert t.flops_by_class()[cls] == pytest.approx(formula[cls], rel=0.005), (cls, req)


def test_layers_found_by_structure_and_counted(tmp_path):
    """GPT-2 keeps its layers under transformer.h: every one counts (the old name-based dedup counted one)."""
    spec = resolve_model(tiny(tmp_path, "gpt2"))
    t = trace(spec, PREFILL)
    qkv = [op for op in t.ops if op.module.endswith("attn.c_attn")]
    assert len(qkv) == 1 and qkv[0].count == 3 and qkv[0].layer == 0
    assert sum(op.count for op in t.ops if op.attention is not None) == 3


def test_recurrent_state_ops_and_memory(tmp_path):
    from cli.inference.memory import estimate_memory
    spec = resolve_model(tiny(tmp_path, "jamba"))
    short, long = trace(spec, Request(1, 1, 10, decode=True)), trace(spec, Request(1, 1, 1000, decode=True))
    assert short.state_bytes_per_sequence == long.state_bytes_per_sequence > 0  # constant in length
    states = [op for op in long.ops if op.state is not None]
    assert {op.state.kind for op in states} == {"causal_conv1d", "selective_scan"}
    assert all(op.state.reads_state for op in states)
    # KV only for the 2 attention layers (of 4): 2 layers x K and V x 2 KV heads x 16 dims x 2 bytes
    assert long.kv_bytes_per_token == 2 * 2 * 2 * 16 * 2
    one, eight = (estimate_memory(long, n * 1001, 1, 1, 80, sequences=n) for n in (1, 8))
    assert eight.state_cache == pytest.approx(8 * one.state_cache) and one.state_cache == long.state_bytes_per_sequence
    assert any("constant-size state" in n for n in long.notes)
    with pytest.raises(ValueError, match="number of sequences"):
        estimate_memory(long, 1001, 1, 1, 80)


def test_delta_rule_and_ssd_work(tmp_path):
    t = trace(resolve_model(tiny(tmp_path, "qwen3_next")), Request(1, 20, 0))
    rule = next(op for op in t.ops if op.state is not None and op.state.kind == "gated_delta_rule")
    assert rule.count == 3 and not rule.state.reads_state  # 3 linear-attention layers, no cached state
    assert rule.state.state_elements == 4 * 16 * 16            # value heads x key dim x value dim
    assert chunk_pairs(20, 8) == 2 * 36 + 10 and chunk_pairs(8, 8) == 36
    ssd = next(op for op in trace(resolve_model(tiny(tmp_path, "mamba2")), Request(1, 1, 5, decode=True)).ops
               if op.state is not None and op.state.kind == "ssd")
    assert ssd.state.matrix_flops == 0 and ssd.state.vector_flops == 8 * 16 * (5 * 16 + 4)  # recurrent decode step


def test_llama4_experts_routed_and_chunked_attention(tmp_path):
    t = trace(resolve_model(tiny(tmp_path, "llama4_text")), Request(1, 8, 40))
    experts = [op for op in t.ops if op.experts is not None]
    assert experts and all(op.experts.top_k == 1 and op.experts.num_experts == 4 for op in experts)
    chunked = [op.attention for op in t.ops if op.attention is not None and op.attention.chunk]
    assert chunked and chunked[0].pairs_per_sequence == chunked_pairs(8, 40, 16) == sum(
        p % 16 + 1 for p in range(40, 48))
    assert chunked_pairs(5, 0, 100) == causal_pairs(5, 0)


def test_chunk_segments_are_the_virtual_sequences_of_a_chunked_step():
    from cost.engine_pricing import chunk_segments
    assert chunk_segments(8, 40, 16) == [(8, 8, 1)]                       # positions 40-47, all in chunk 2
    assert chunk_segments(40, 0, 16) == [(16, 0, 2), (8, 0, 1)]           # a 40-token prompt: two whole chunks
    assert chunk_segments(20, 10, 16) == [(6, 10, 1), (14, 0, 1)]
    assert chunk_segments(1, 33, 16) == [(1, 1, 1)]                       # a decode sees its chunk's keys only
    for q, c in [(8, 40), (40, 0), (20, 10), (1, 33), (100, 7)]:          # the pairs the tracer counts
        assert sum(n * causal_pairs(sq, sc) for sq, sc, n in chunk_segments(q, c, 16)) == chunked_pairs(q, c, 16)


def test_engine_pricing_of_a_binding_chunk_says_how_it_is_priced(tmp_path):
    from cost.estimate import estimate
    from cost.profile import load_profile
    model = resolve_model(tiny(tmp_path, "llama4_text"))
    t = trace(model, Request(1, 8, 40))                          # 48 keys over chunks of 16
    vllm = estimate(t, load_profile("h100"), engine="vllm")
    assert any("chunked local attention (a chunk of 16 tokens) priced by chunks" in n for n in vllm.notes), vllm.notes
    sglang = estimate(t, load_profile("h100"), engine="sglang")
    assert any("chunked local attention (a chunk of 16 tokens) priced as full causal attention over all 48 keys"
               in n for n in sglang.notes), sglang.notes
    within = estimate(trace(model, Request(1, 4, 8)), load_profile("h100"), engine="vllm")    # 12 keys: no effect
    assert not any("chunked local attention" in n for n in within.notes)


def test_vllm_prices_a_long_chunked_prompt_below_full_attention(tmp_path, monkeypatch):
    """A 32k prompt over chunks of 8192 is four chunks' causal attention, a quarter of the full prompt's pairs."""
    from dataclasses import replace
    from cost import engines
    from cost import estimate as estimate_module
    from cost.estimate import estimate
    from cost.profile import load_profile
    chunked = resolve_model(tiny(tmp_path, "llama4_text", num_attention_heads=32, num_key_value_heads=8,
                                 head_dim=128, hidden_size=4096, attention_chunk_size=8192))
    t = trace(chunked, Request(1, 32768, 0))
    hw = load_profile("h100")
    def attention_s(engine):
        e = estimate(t, hw, engine=engine)
        return sum(p.total_seconds for p in e.kernels if p.kernel.op is not None
                   and p.kernel.op.attention is not None and p.kernel.op.attention.chunk)
    by_chunks = attention_s("vllm")
    monkeypatch.setitem(engines.ENGINES, "vllm", replace(engines.ENGINES["vllm"], runs_attention_chunks=False))
    monkeypatch.setattr(estimate_module, "_PRICE_CACHE", {})
    full = attention_s("vllm")
    assert 0.2 < by_chunks / full < 0.35, (by_chunks, full)


def test_config_reload_with_infinity(tmp_path):
    """transformers writes time_step_limit = (0, inf) as {"__float__": "Infinity"}; it reads back as inf."""
    folder = tiny(tmp_path, "mamba2")
    assert '"__float__": "Infinity"' in (tmp_path / "mamba2" / "config.json").read_text()
    assert resolve_model(folder).config["time_step_limit"][1] == float("inf")


def test_vision_language_text_backbone_and_image_tokens(tmp_path, capsys):
    from cli.inference.text_generate import main as tg_main
    folder = tiny(tmp_path, "llava",
                  text_config=dict(model_type="llama", **{k: v for k, v in TINY["phi3"].items()
                                                          if k not in ("pad_token_id", "eos_token_id",
                                                                       "bos_token_id")}),
                  vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64,
                                     num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14),
                  image_token_id=99)
    spec = resolve_model(folder)
    plain, images = trace(spec, Request(1, 8, 0)), trace(spec, Request(1, 8, 0), TraceOptions(image_tokens=10))
    _assert_checks(images)
    assert images.image_tokens == 10 and images.flops > plain.flops
    assert any("vision encoder: 3 image(s)" in n for n in images.notes)  # 4 tokens per 28x28 image
    assert sum(op.count for op in images.ops if op.attention is not None and not op.attention.causal) == 1
    formula = model_flops(full_config(spec), Request(1, 8, 0))
    assert plain.flops_by_class()["gemm"] == pytest.approx(formula["gemm"], rel=0.005)
    assert tg_main([folder, "--device", "h100", "-q", "8", "--image-tokens", "10"]) == 0
    assert "image tokens: 10 per sequence" in capsys.readouterr().out
    assert tg_main([tiny(tmp_path, "gpt2"), "--device", "h100", "-q", "8", "--image-tokens", "10"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "vision-language" in err


def test_lm_head_on_the_last_token_only(tmp_path):
    """Whisper's decoder has no logits_to_keep: the tracer still computes logits for the last token only."""
    folder = tiny(tmp_path, "whisper", d_model=64, decoder_layers=2, decoder_attention_heads=4, decoder_ffn_dim=128,
                  encoder_layers=1, encoder_attention_heads=4, encoder_ffn_dim=64, vocab_size=100, pad_token_id=0,
                  bos_token_id=1, eos_token_id=1, decoder_start_token_id=1)
    t = trace(resolve_model(folder), Request(2, 8, 0))
    _assert_checks(t)
    head = [op for op in t.ops if op.gemm is not None and op.gemm.n == 100]
    assert head and head[0].gemm.m == 2


def test_identity_catches_uncounted_layers(tmp_path, monkeypatch):
    from tracer import work
    monkeypatch.setenv("TRACECOST_NO_CACHE", "1")
    monkeypatch.setattr(work.Op, "times", lambda self, count: self)  # repeated layers not multiplied
    with pytest.raises(ModelError, match="FLOP identity check failed"):
        trace(resolve_model(tiny(tmp_path, "gpt2", vocab_size=101)), PREFILL)


def test_identity_catches_dense_experts(tmp_path, monkeypatch):
    from tracer import experts
    monkeypatch.setenv("TRACECOST_NO_CACHE", "1")
    monkeypatch.setattr(experts, "ROUTED_FORWARDS", {})  # HF's Llama-4 path: every token through every expert
    with pytest.raises(ModelError, match=r"FLOP identity check failed.*\+"):
        trace(resolve_model(tiny(tmp_path, "llama4_text", vocab_size=101)), PREFILL)


def test_attention_must_see_the_cache(tmp_path, monkeypatch):
    from tracer import kv_cache
    monkeypatch.setenv("TRACECOST_NO_CACHE", "1")
    monkeypatch.setattr(kv_cache.MetaKVLayer, "update", lambda self, k, v, *a, **kw: (k, v))
    with pytest.raises(ModelError, match="cache check failed: attention in .* sees 0 cached tokens, not 24"):
        trace(resolve_model(tiny(tmp_path, "gpt_neox", vocab_size=101)), PREFILL)


def test_dedup_self_test_falls_back_to_every_layer(tmp_path, monkeypatch):
    from tracer import layers
    monkeypatch.setenv("TRACECOST_NO_CACHE", "1")
    # a signature blind to the sliding window groups Gemma-2's local and global layers together
    monkeypatch.setattr(layers, "layer_signature", lambda layer, kind: type(layer).__name__)
    folder = tiny(tmp_path, "gemma2", hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8, vocab_size=101)
    t = trace(resolve_model(folder), PREFILL)
    assert t.checks["dedup"].startswith("layer dedup self-test failed for Gemma2ForCausalLM")
    assert any("every decoder layer is traced" in n for n in t.notes)
    assert {op.attention.window for op in t.ops if op.attention is not None} == {None, 8}
    assert sum(op.count for op in t.ops if op.attention is not None) == 4


def test_unsupported_model_type_is_one_line(tmp_path, capsys):
    from transformers import AutoConfig
    (tmp_path / "t5").mkdir()
    AutoConfig.for_model("t5", d_model=64, num_layers=1, num_heads=2, d_ff=64).to_json_file(
        str(tmp_path / "t5" / "config.json"))
    assert tracer_main([str(tmp_path / "t5"), "-q", "8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: unsupported: model type 't5'") and "Traceback" not in err


def test_crosscheck_says_when_no_formula_covers_the_model(tmp_path, capsys):
    assert tracer_main([tiny(tmp_path, "rwkv"), "-q", "8", "--crosscheck"]) == 0
    assert "cross-check: no hand-written formula covers model type 'rwkv'" in capsys.readouterr().out
    assert tracer_main([tiny(tmp_path, "mamba2"), "-q", "8", "--crosscheck", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["flops_by_class"]["attention"] == pytest.approx(out["formula_flops_by_class"]["attention"], rel=0.005)


def test_recurrent_ops_priced_and_noted_by_text_generate(tmp_path, capsys):
    from cli.inference.text_generate import main as tg_main
    from cost.estimate import estimate, price_kernel
    from cost.execution import build_kernels
    from cost.profile import load_profile
    hw = load_profile("h100")
    t = trace(resolve_model(tiny(tmp_path, "mamba2")), Request(4, 1, 100, decode=True))
    state_kernels = [k for k in build_kernels(t, "engine") if k.op is not None and k.op.state is not None]
    assert state_kernels and all(price_kernel(k, hw).seconds > 0 for k in state_kernels)
    assert estimate(t, hw).breakdown_s["attention"] > 0  # the SSD cores sit in the attention class
    assert tg_main([tiny(tmp_path, "mamba2"), "--device", "h100", "--decode", "-c", "100", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["memory_gb"]["state_cache"] > 0 and any("checkpointed the state" in n for n in out["notes"])


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_grouped_mm_experts_trace_in_any_dtype(tmp_path, monkeypatch, dtype):
    """torch's meta _grouped_mm accepts bf16 only; the experts op stands for it, so other dtypes trace too."""
    monkeypatch.setenv("TRACECOST_NO_CACHE", "1")
    folder = tiny(tmp_path, "qwen3_moe", hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4,
                  num_experts_per_tok=2, vocab_size=100)
    spec = resolve_model(folder)
    t, ref = trace(spec, PREFILL, TraceOptions(dtype=dtype)), trace(spec, PREFILL, TraceOptions(dtype="bf16"))
    _assert_checks(t)
    experts = [op for op in t.ops if op.experts is not None]
    assert experts and sum(op.count for op in experts) == 2
    assert t.flops_by_class()["gemm"] == pytest.approx(ref.flops_by_class()["gemm"], rel=1e-9)


def test_a_model_without_kv_cache_recomputes_the_whole_sequence(tmp_path, monkeypatch):
    """GPT-1 keeps no KV cache: a step over 16 earlier tokens is the forward of all 24, said in a note."""
    monkeypatch.setenv("TRACECOST_NO_CACHE", "1")
    spec = resolve_model(tiny(tmp_path, "openai-gpt", n_embd=64, n_layer=2, n_head=4, vocab_size=100))
    step, whole = trace(spec, Request(2, 8, 16)), trace(spec, Request(2, 24, 0))
    _assert_checks(step)
    assert step.request == Request(2, 8, 16)
    assert step.flops_by_class() == pytest.approx(whole.flops_by_class(), rel=1e-12)
    assert step.kv_bytes_per_token == 0
    assert any("keeps no KV cache: this step recomputes all 24 tokens" in n for n in step.notes)
    from serving.step_cost import StepCost
    from cost.profile import load_profile
    with pytest.raises(ModelError, match="keeps no KV cache, so every step recomputes"):
        StepCost(spec, load_profile("h100"), TraceOptions(), "eager", 1).decode_attention(1, 16)


def test_refusals_say_what_is_unsupported(tmp_path, capsys):
    """Routed experts with no top-k are named rather than passed through."""
    assert tracer_main([tiny(tmp_path, "deepseek_v2", **{**TINY["phi3"], "n_routed_experts": 4,
                                                         "moe_intermediate_size": 32, "num_experts_per_tok": None}),
                        "-q", "8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "4 routed experts but no num_experts_per_tok" in err


def test_serving_sim_refuses_a_model_without_kv_cache(tmp_path, capsys):
    from cli.inference.serving_sim import main as sim_main
    assert sim_main([tiny(tmp_path, "mamba2"), "--device", "h100", "--workload", "multi-turn-chat",
                     "--num-requests", "4", "--max-prefill-tokens", "64"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no attention KV cache (only recurrent state)" in err


def _needs(model_type: str) -> None:
    from transformers import CONFIG_MAPPING
    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"model type {model_type} is not in the installed transformers")


XLNET = dict(d_model=64, n_layer=2, n_head=4, d_inner=128, vocab_size=100)


@pytest.mark.parametrize("attn_type", ["bi", "uni"])
def test_xlnet_relative_attention_traces_exactly(tmp_path, monkeypatch, attn_type):
    """XLNet keeps no KV cache: a step over 16 earlier tokens is the forward of all 24. Its float32 legacy
    parameters run in bf16; its relative attention is one attention op (every key for "bi", causal for "uni") plus
    the position scores over the relative distances (2 x 24, or 24 + 1); its r weight meets those, not the tokens."""
    _needs("xlnet")
    monkeypatch.setenv("TRACECOST_NO_CACHE", "1")
    spec = resolve_model(tiny(tmp_path, "xlnet", attn_type=attn_type, **XLNET))
    step = trace(spec, Request(2, 8, 16))
    _assert_checks(step)
    assert step.flops_by_class() == pytest.approx(trace(spec, Request(2, 24, 0)).flops_by_class(), rel=1e-12)
    batch, seq, d, ffn, heads, vocab = 2, 24, 64, 128, 4, 100
    distances = 2 * seq if attn_type == "bi" else seq + 1  # modeling_xlnet.py relative_positional_encoding
    per_layer = 2 * batch * seq * (4 * d * d + 2 * d * ffn) + 2 * (batch * distances) * d * d
    scores = 2 * batch * heads * seq * distances * (d // heads)
    assert step.flops_by_class()["gemm"] == pytest.approx(2 * per_layer + 2 * scores + 2 * batch * vocab * d, rel=1e-9)
    attention = [op for op in step.ops if op.attention is not None]
    assert sum(op.count for op in attention) == 2
    pairs = seq * (seq + 1) // 2 if attn_type == "uni" else seq * seq
    assert all(op.attention.pairs_per_sequence == pairs for op in attention)
    assert all(op.dtype == "bf16" for op in step.ops if op.op_class == "gemm")
    assert any("torch.FloatTensor" in n for n in step.notes) and any("relative-position table" in n for n in step.notes)


def test_xlnet_identity_needs_the_relative_distances(tmp_path, monkeypatch):
    """Without the relative-distance rows for XLNet's r weight the FLOP identity fails: the check is exact."""
    _needs("xlnet")
    import tracer.checks
    monkeypatch.setenv("TRACECOST_NO_CACHE", "1")
    monkeypatch.setattr(tracer.checks, "RELATIVE_POSITION_WEIGHTS", {})
    with pytest.raises(ModelError, match="FLOP identity check failed"):
        trace(resolve_model(tiny(tmp_path, "xlnet", **XLNET)), Request(1, 4, 8))  # not traced before: not cached


XLM = dict(emb_dim=64, n_layers=2, n_heads=4, vocab_size=100, n_langs=1)


@pytest.mark.parametrize("causal", [False, True])
def test_xlm_takes_the_whole_sequence(tmp_path, monkeypatch, causal):
    """XLM's forward takes every token and drops the cached ones itself. Causal, a step over 16 cached tokens
    computes the 8 new ones and writes their KV; bidirectional (its default), no KV cache stays valid, so the
    step is the forward of all 24 tokens, every query seeing every key, said in a note."""
    _needs("xlm")
    monkeypatch.setenv("TRACECOST_NO_CACHE", "1")
    spec = resolve_model(tiny(tmp_path, "xlm", causal=causal, **XLM))
    step = trace(spec, Request(2, 8, 16))
    _assert_checks(step)
    batch, d, layers = 2, 64, 2
    rows = batch * (8 if causal else 24)
    assert step.flops_by_class()["gemm"] == pytest.approx(
        layers * 2 * rows * (4 * d * d + 2 * d * 4 * d) + 2 * batch * 100 * d, rel=1e-9)
    attention = [op.attention for op in step.ops if op.attention is not None]
    assert sum(op.count for op in step.ops if op.attention is not None) == layers
    pairs = 8 * 16 + 8 * 9 // 2 if causal else 24 * 24
    assert all(w.pairs_per_sequence == pairs and w.causal is causal for w in attention)
    assert step.recomputes_context is not causal
    if causal:
        assert step.kv_bytes_per_token == 2 * layers * d * 2  # K and V of each layer, bf16
    else:
        assert any("attends bidirectionally (causal=false)" in n and "recomputes all 24 tokens" in n
                   for n in step.notes)


CPMANT = dict(hidden_size=64, num_attention_heads=4, dim_head=16, dim_ff=128, num_hidden_layers=2, vocab_size=100,
              prompt_length=4, prompt_types=2, segment_types=2, position_bias_num_buckets=32,
              position_bias_max_distance=64)


def test_cpmant_soft_prompt_runs_first_and_stays_cached(tmp_path, monkeypatch):
    """CPM-Ant's forward takes the whole sequence and puts 4 learned prompt tokens ahead of it: the first step runs
    them through every layer with the 16 new tokens; a later step over 24 cached tokens computes 8 new ones, whose
    attention sees the 4 + 24 cached ones."""
    _needs("cpmant")
    monkeypatch.setenv("TRACECOST_NO_CACHE", "1")
    spec = resolve_model(tiny(tmp_path, "cpmant", **CPMANT))
    first, later = trace(spec, Request(2, 16, 0)), trace(spec, Request(2, 8, 24))
    batch, d, ffn, layers = 2, 64, 128, 2
    for t, rows in ((first, batch * (16 + 4)), (later, batch * 8)):
        _assert_checks(t)
        assert t.flops_by_class()["gemm"] == pytest.approx(
            layers * 2 * rows * (4 * d * d + 3 * d * ffn) + 2 * batch * 100 * d, rel=1e-9)
        assert any("4 soft-prompt tokens" in n for n in t.notes)
        assert t.kv_bytes_per_token == 2 * layers * d * 2
    assert {op.attention.context_length for op in later.ops if op.attention is not None} == {4 + 24}
    assert {op.attention.query_length for op in first.ops if op.attention is not None} == {16 + 4}
