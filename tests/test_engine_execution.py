"""Whole steps priced with an engine's kernels: the kernels a real engine runs, each counted once."""
import json

import pytest

from cli.inference.text_generate import main as text_generate
from cost.estimate import Parallelism, engine_allreduce_seconds, estimate
from cost.execution import ENGINE, build_kernels
from cost.profile import load_profile
from tracer import Request, TraceOptions, trace


def test_attention_writes_the_kv_cache_itself():
    t = trace("llama-3.2-1b", Request(2, 128, 256), TraceOptions())
    assert any(op.kv_cache_write for op in t.ops)
    kernels = build_kernels(t, ENGINE)
    assert not any(k.op is not None and k.op.kv_cache_write for k in kernels)
    assert sum(k.count for k in kernels if k.op is not None and k.op.attention is not None) == t.num_layers


def test_fused_moe_layer_absorbs_routing_and_permutation():
    t = trace("qwen3-30b-a3b", Request(4, 64, 0), TraceOptions())
    kernels = build_kernels(t, ENGINE)
    moe = [k for k in kernels if k.moe is not None]
    assert sum(k.count for k in moe) == 48
    leftovers = [k for k in kernels if k.op_class == "other" and (".mlp.experts" in k.module or ".mlp.gate" in k.module)]
    assert not leftovers, [k.module for k in leftovers]
    assert any(k.op_class == "gemm" and k.module.endswith("mlp.gate") for k in kernels)   # the router GEMM stays


def test_all_tokens_expert_parallelism_does_not_divide_the_layer_by_ep():
    hw = load_profile("h200")
    t = trace("qwen3-30b-a3b", Request(8, 1, 2048, decode=True), TraceOptions())

    def moe_ms(par):
        e = estimate(t, hw, ENGINE, par)
        return sum(pk.total_seconds for pk in e.kernels if pk.kernel.moe is not None) * 1e3

    one, ep8 = moe_ms(Parallelism(1, 1)), moe_ms(Parallelism(8, 8))
    assert ep8 > one / 8 * 1.5          # every rank still routes and permutes all tokens
    dispatch = estimate(t, hw, ENGINE, Parallelism(8, 8, "dispatch"))
    assert any("dispatch-style EP" in n for n in dispatch.notes)


def test_moe_imbalance_slows_the_engines_fused_moe_as_it_does_eager():
    """--moe-imbalance F: the busiest expert takes F times its share and sets the pace, in engine execution too
    (it was dropped there: the fused-MoE layer priced balanced routing whatever F)."""
    hw = load_profile("h100")

    def moe_ms(imbalance: float) -> float:
        t = trace("qwen3-30b-a3b", Request(1, 8192, 0), TraceOptions(moe_imbalance=imbalance))
        e = estimate(t, hw, ENGINE)
        assert (imbalance != 1.0) == any(n.startswith("MoE imbalance") for n in e.notes)
        return sum(pk.total_seconds for pk in e.kernels if pk.kernel.moe is not None) * 1e3

    one, two, four = moe_ms(1.0), moe_ms(2.0), moe_ms(4.0)
    assert one < two < four
    assert 1.5 < two / one <= 2.0 + 1e-9      # prefill experts are compute-bound: near F, never beyond it


def test_engine_all_reduce_picks_custom_or_nccl_like_the_engine():
    h200, l40s = load_profile("h200"), load_profile("l40s")
    small_nvlink = engine_allreduce_seconds(64 * 1024, 8, h200, "vllm")
    assert 3e-6 < small_nvlink < 15e-6                         # the custom all-reduce under CUDA graphs
    big = engine_allreduce_seconds(256 * 2**20, 8, h200, "vllm")
    assert big > 100 * small_nvlink
    pcie = engine_allreduce_seconds(64 * 2**20, 8, l40s, "vllm")   # PCIe-only: NCCL, tens of ms at 8 GPUs
    assert pcie > 5e-3


def test_engine_estimate_reports_its_kernel_source():
    t = trace("llama-3.2-1b", Request(1, 1, 1024, decode=True), TraceOptions())
    e = estimate(t, load_profile("h100"), ENGINE, engine="vllm")
    assert e.engine == "vllm" and any("vLLM kernels: fitted" in n for n in e.notes)
    assert e.latency_s > 0


def test_text_generate_engine_flag(capsys):
    assert text_generate(["llama-3.2-1b", "--device", "h100", "-q", "512", "--engine", "sglang", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["engine"] == "sglang" and any("SGLang" in n for n in out["notes"])
    with pytest.raises(SystemExit) as e:
        text_generate(["llama-3.2-1b", "--device", "h100", "--engine", "tgi"])
    assert e.value.code == 2 and "unknown engine 'tgi'" in capsys.readouterr().err
    assert text_generate(["llama-3.2-1b", "--device", "h100", "--execution", "eager", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["engine"] is None


def test_fp8_weights_are_faster_but_not_twice_as_fast():
    hw = load_profile("h100")
    step = Request(8, 1, 2048, decode=True)
    bf16 = estimate(trace("llama-3.1-8b", step, TraceOptions(dtype="bf16")), hw).latency_s
    fp8 = estimate(trace("llama-3.1-8b", step, TraceOptions(dtype="fp8")), hw).latency_s
    assert 0.45 < fp8 / bf16 < 1.0
    # the official DeepSeek-V3 FP8 checkpoint declares 128x128 block scales: priced as fp8_block
    assert trace("deepseek-v2-lite", step, TraceOptions(dtype="fp8_block")).options.dtype == "fp8_block"
    from tracer.model_source import config_weight_dtype
    block = {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    assert config_weight_dtype(block) == "fp8_block"
    assert config_weight_dtype({"quantization_config": {"quant_method": "fp8"}}) == "fp8"
