"""SGLang's MoE runner per model architecture and device (cost/engine_kernels/moe_runners.py): the kernel tables'
rows keep their runner apart, a step's routed experts take the runner the engine picks, and a device without that
runner's kernel model says so."""
from dataclasses import replace

import pytest

from cost.engine_kernels.moe_runners import key_format, model_runner, moe_key, table_runner
from cost.estimate import Parallelism, estimate
from cost.kernel_rows import MoeRow, RowError, group_key, parse_row, price_rows_traced
from cost import profile as profile_module
from cost.profile import load_profile
from tracer.trace import trace
from tracer.work import Request

QWEN3_MOE, MIXTRAL, NEMOTRON_H = "Qwen3MoeForCausalLM", "MixtralForCausalLM", "NemotronHForCausalLM"


def test_the_tables_kernel_source_names_the_runner_where_a_format_splits():
    assert table_runner("sglang", "bf16", "sglang_flashinfer_trtllm_moe") == "flashinfer_trtllm"
    assert table_runner("sglang", "bf16", "sglang_flashinfer_cutlass_moe") == "flashinfer_cutlass"
    assert table_runner("sglang", "bf16", "sglang_fused_moe_triton") == ""       # the default runner
    assert table_runner("sglang", "fp8_block", "sglang_flashinfer_trtllm_moe") == "flashinfer_trtllm"
    # nvfp4 runs one kernel per device: its plain fit is that kernel's
    assert table_runner("sglang", "nvfp4", "sglang_flashinfer_trtllm_moe") == ""
    assert table_runner("vllm", "bf16", "vllm_unquantizedfusedmoe_flashinfer_trtllm_trtllmbf16experts") == ""
    assert moe_key("fp8_block", "flashinfer_trtllm") == "fp8_block_flashinfer_trtllm"
    assert key_format("fp8_block_flashinfer_trtllm") == "fp8_block" and key_format("fp8_block") == "fp8_block"


def test_sglang_picks_the_runner_by_architecture_and_device():
    qwen = model_runner("sglang", "b200", QWEN3_MOE, "bf16")
    assert qwen.runner == "flashinfer_trtllm" and "server_args.py" in qwen.source
    assert model_runner("sglang", "gb300", "DeepseekV3ForCausalLM", "fp8_block").runner == "flashinfer_trtllm"
    assert model_runner("sglang", "b200", MIXTRAL, "bf16") is None              # Triton, the default
    assert model_runner("sglang", "h200", QWEN3_MOE, "bf16") is None            # SM90: Triton
    assert model_runner("sglang", "b200", QWEN3_MOE, "nvfp4") is None           # a format that does not split
    assert model_runner("sglang", "h200", NEMOTRON_H, "bf16").runner == "flashinfer_cutlass"
    assert model_runner("sglang", "b300", NEMOTRON_H, "bf16").runner == "flashinfer_trtllm"
    # an all-to-all backend (dispatch-style EP) keeps the engine off these runners
    assert model_runner("sglang", "b200", QWEN3_MOE, "bf16", all_to_all=True) is None
    assert model_runner("vllm", "b200", QWEN3_MOE, "bf16") is None


def test_a_row_names_its_runner_and_is_fitted_apart():
    row = parse_row({"op": "moe", "tokens": 4096, "hidden": 4096, "inter": 1536, "experts": 128, "top_k": 8,
                     "runner": "flashinfer_trtllm"}, 1)
    assert row.runner == "flashinfer_trtllm" and group_key(row) == ("moe", "bf16_flashinfer_trtllm")
    assert group_key(replace(row, runner="")) == ("moe", "bf16")
    with pytest.raises(RowError, match=r"'runner' must be one of \"\" \(the engine's default\), flashinfer_cutlass"):
        parse_row({"op": "moe", "tokens": 1, "hidden": 64, "inter": 64, "experts": 8, "top_k": 2,
                   "runner": "cutlass_v9"}, 3)


def test_the_trtllm_runner_prices_qwen3_shapes_apart_from_triton_on_blackwell():
    hw = load_profile("gb200")
    cal = hw.engine("sglang")
    assert "bf16_flashinfer_trtllm" in cal.moe and "fp8_block_flashinfer_trtllm" in cal.moe
    # Qwen3-235B's layer at 16k tokens: ~1,050 TFLOPS measured on flashinfer_trtllm, ~400 for shapes on Triton
    rows = [MoeRow(16384, 4096, 1536, 128, 8, runner=r) for r in ("flashinfer_trtllm", "")]
    seconds, models = price_rows_traced(cal, hw, rows)
    assert models == ["moe.bf16_flashinfer_trtllm", "moe.bf16"]
    flops = 2 * 16384 * 8 * 3 * 4096 * 1536
    assert flops / seconds[0] / 1e12 > 800 and seconds[1] > 1.5 * seconds[0]


def _step(model: str, device: str = "b200"):
    return estimate(trace(model, Request(1, 8192, 0)), load_profile(device), engine="sglang")


def test_a_step_runs_the_experts_on_the_engines_runner_and_says_so(monkeypatch):
    e = _step("qwen3-30b-a3b")
    assert any("flashinfer_trtllm MoE runner, which it picks for Qwen3MoeForCausalLM" in n
               and "own kernel model (moe.bf16_flashinfer_trtllm)" in n for n in e.notes), e.notes
    # the same device without the runner's own kernel model
    hw = load_profile("b200")
    calibrations = dict(hw.engine_calibrations())
    cal = calibrations["sglang"]
    calibrations["sglang"] = replace(cal, moe={k: v for k, v in cal.moe.items() if "_flashinfer" not in k})
    monkeypatch.setitem(profile_module._ENGINE_CACHE, hw.path or hw.key, calibrations)
    unfitted = _step("qwen3-30b-a3b")
    assert any("no kernel model of that runner" in n and "moe.bf16" in n for n in unfitted.notes), unfitted.notes
    assert unfitted.breakdown_s["gemm"] != pytest.approx(e.breakdown_s["gemm"], rel=0.01)
    # Mixtral runs SGLang's default Triton kernel: no runner note
    assert not any("MoE runner" in n for n in _step("mixtral-8x7b").notes)
    assert not any("MoE runner" in n for n in
                   estimate(trace("qwen3-30b-a3b", Request(1, 64, 0)), load_profile("b200"), engine="sglang",
                            par=Parallelism(ep=2, ep_style="dispatch")).notes)


def test_the_trace_records_the_configs_architecture():
    assert trace("qwen3-30b-a3b", Request(1, 1, 0)).architecture == QWEN3_MOE
    assert trace("mixtral-8x7b", Request(1, 1, 0)).architecture == MIXTRAL
