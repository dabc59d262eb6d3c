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
from tracer.work import Request, TraceOptions

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


DEEPSEEK_V3 = "DeepseekV3ForCausalLM"


def test_trtllm_tables_split_the_cutlass_moe_into_its_default_and_min_latency_flows():
    # the longest source naming the kernel wins: "moe_torch_flow" is also in "moe_torch_flow_min_latency"
    assert table_runner("trtllm", "nvfp4", "moe_torch_flow_min_latency") == "min_latency"
    assert table_runner("trtllm", "nvfp4", "moe_torch_flow_cutlass") == ""       # the default flow
    assert table_runner("trtllm", "nvfp4", "moe_torch_flow") == ""
    assert table_runner("trtllm", "fp8", "moe_torch_flow_min_latency") == ""      # only nvfp4 splits


def test_trtllm_takes_the_min_latency_flow_only_for_small_fused_tensor_parallel_steps_before_0_21():
    def runner(device="b200", arch=DEEPSEEK_V3, fmt="nvfp4", tokens=4, tp_allreduce=True, release="0.20"):
        choice = model_runner("trtllm", device, arch, fmt, False, tokens, tp_allreduce, release)
        return choice.runner if choice else None

    assert runner() == "min_latency" and runner(tokens=128) == "min_latency" and runner(release="0.18") == "min_latency"
    assert runner(device="gb200", release="0.20.0rc3") == "min_latency"
    assert runner(tokens=129) is None                 # past 128 tokens: the default flow
    assert runner(tokens=None) is None                # a step of unknown size meets no bound
    assert runner(tp_allreduce=False) is None         # attention DP (or one GPU): no fused allreduce
    assert runner(release="1.0") is None and runner(release="") is None   # removed before 1.0; "": the newest
    assert runner(device="h200") is None and runner(fmt="fp8") is None
    assert runner(arch=QWEN3_MOE) is None
    choice = model_runner("trtllm", "b200", DEEPSEEK_V3, "nvfp4", False, 4, True, "0.20")
    assert "128 tokens a step or fewer" in choice.when and "before 0.21" in choice.when
    assert "modeling_deepseekv3.py" in choice.source_file


def test_a_small_tensor_parallel_deepseek_step_on_b200_prices_trtllm_0_20s_min_latency_flow():
    """B200's TensorRT-LLM tables time the two flows apart; a 0.20 step of 4 tokens runs the min-latency one (about
    half the default flow's time at DeepSeek-V3's MoE TP4 x EP2 shape), a step past 128 tokens, attention DP or the
    newest release the default one."""
    options = TraceOptions(dtype="fp4")
    hw = load_profile("b200")
    assert {"nvfp4", "nvfp4_min_latency"} <= set(hw.engine("trtllm").moe)

    def moe_ms(tokens, release="0.20", par=Parallelism(8, ep=2)):
        e = estimate(trace("deepseek-v3", Request(tokens, 1, 2048), options), hw.at_engine_release(release),
                     engine="trtllm", par=par)
        moe = sum(pk.total_seconds for pk in e.kernels if pk.kernel.moe is not None) * 1e3
        return moe, e.notes

    small, notes = moe_ms(4)
    assert any("min_latency MoE runner" in n and "128 tokens a step or fewer" in n for n in notes), notes
    newest, newest_notes = moe_ms(4, release="")
    assert not any("MoE runner" in n for n in newest_notes)
    assert newest > 1.4 * small
    assert not any("MoE runner" in n for n in moe_ms(256)[1])
    assert not any("MoE runner" in n for n in moe_ms(4, par=Parallelism(1, ep=8, attention_dp=8))[1])
