"""vLLM runs gpt-oss's attention (sink logits) through its Triton unified kernel where FlashAttention-3 does not run:
its prefill re-reads the keys and values once per 16 query rows (cost/engine_kernels/unified_attention.py)."""
import json

import numpy as np
import pytest

from cost.engine_kernels import StreamParams, Times
from cost.engine_kernels.unified_attention import unified_prefill_time, unified_rows
from cost.estimate import estimate
from cost.profile import ProfileError, load_profile, parse_profile, profiles_dir
from tracer.trace import trace
from tracer.work import Request


def test_a_program_holds_sixteen_rows_of_one_kv_heads_query_heads():
    assert unified_rows(8) == (16, 2)      # gpt-oss: 64 query heads over 8 KV heads
    assert unified_rows(1) == (16, 16)
    assert unified_rows(5) == (16, 3)
    assert unified_rows(32) == (32, 1)     # a larger group rounds up to a power of two, one token a program


def test_prefill_rereads_against_the_hand_formula():
    stream = StreamParams(fixed_us=2.0, memory=0.8, row_ns=0.0, l2_speedup=2.0)
    flash = Times(np.array(1e-4), np.array(1e-4), np.array(0.0), np.array(0.0))
    bandwidth, l2 = 2.0e12, 40e6
    t = unified_prefill_time(flash, stream, bandwidth, l2, 1, 2048, 30000, 64, 8, 64, 64, l2_share=0.5)
    # 1024 programs a KV head (2 tokens each) see 30000 + (2048 + 2) / 2 + 16 keys of 8 heads x 128 x 2 bytes
    rereads = 1024 * (30000 + 1025 + 16) * 8 * 128 * 2
    hit = 20e6 / (32048 * 8 * 128 * 2)     # half of L2 over the call's keys and values
    expected = 2e-6 + rereads * (hit / 2.0 + 1 - hit) / (bandwidth * 0.8)
    assert float(t.seconds) == pytest.approx(expected, rel=1e-9)
    # the unified kernel is never faster than the fitted kernel on the same call
    slow_flash = Times(np.array(10.0), np.array(10.0), np.array(0.0), np.array(0.0))
    assert float(unified_prefill_time(slow_flash, stream, bandwidth, l2, 1, 2048, 30000, 64, 8, 64, 64).seconds) == 10.0
    # a sliding window caps the keys each program sees
    windowed = unified_prefill_time(flash, stream, bandwidth, l2, 1, 2048, 30000, 64, 8, 64, 64, window=128)
    assert float(windowed.seconds) < 1e-3 < expected


def _attention_ms(model, device, engine, context):
    e = estimate(trace(model, Request(1, 2048, context)), load_profile(device), engine=engine)
    return e.breakdown_s["attention"] * 1e3, e.notes


def test_vllm_prices_sink_attention_on_its_triton_kernel_only_where_it_runs_it():
    a100_vllm, notes = _attention_ms("gpt-oss-20b", "a100", "vllm", 30000)
    a100_sglang, sglang_notes = _attention_ms("gpt-oss-20b", "a100", "sglang", 30000)
    said = [n for n in notes if "attention with sink logits on its Triton unified" in n]
    assert said and "has_sink and not is_device_capability(90)" in said[0]
    assert not any("attention with sink logits on its Triton unified" in n for n in sglang_notes)
    # long context: the re-reads take several times the flash kernel's time
    assert a100_vllm > 3 * a100_sglang
    # Hopper runs sinks in FlashAttention-3; a model without sinks keeps the fitted kernel on A100
    _, h100_notes = _attention_ms("gpt-oss-20b", "h100", "vllm", 30000)
    _, llama_notes = _attention_ms("llama-3.1-8b", "a100", "vllm", 30000)
    assert not any("attention with sink logits on its Triton unified" in n for n in h100_notes + llama_notes)
    # Ada parts without their own engine fit take the rule with the L40S's
    assert load_profile("l4").engine("vllm").sink_attention["kernel"] == "triton_unified"


@pytest.mark.parametrize("value, message", [
    ({"kernel": "xformers", "why": "x"}, "unknown kernel 'xformers'"),
    ({"kernel": "triton_unified"}, "must be"),
    ({"kernel": "triton_unified", "why": "x", "l2_share": 1.5}, "l2_share: must be a number in (0, 1]"),
])
def test_a_malformed_sink_attention_names_the_field(value, message):
    data = json.loads((profiles_dir() / "a100.json").read_text())
    data["engines"]["vllm"]["sink_attention"] = value
    with pytest.raises(ProfileError, match=r"engines\.vllm\.sink_attention.*" + message.replace("(", r"\(")
                       .replace(")", r"\)").replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        parse_profile(data, "custom_a100", "custom.json").engine("vllm")


def test_serving_commands_carry_the_kernel_note():
    from cost.estimate import Parallelism
    from serving.step_cost import StepCost
    from tracer.model_source import resolve_model
    from tracer.work import TraceOptions
    cost = StepCost(resolve_model("gpt-oss-20b"), load_profile("a100"), TraceOptions(), "engine", Parallelism(1))
    assert any("attention with sink logits on its Triton unified" in n for n in cost.formats_notes())
