"""Kernels per engine release: an older release's tables fitted beside the newest, and the rows and runs of that
release priced with them; attention-DP rows and the Llama-4 configurations the held-out tables need."""
import json

import pytest

from cost.engine_kernels.calibration import parse_calibration, release_series
from cost.engines import nearest_release
from cost.kernel_db import KernelDBError, load_tables, table_systems
from cost.kernel_rows import parse_row, price_rows
from cost.profile import load_profile
from serving.published import map_row

MOE_CSV = """framework,version,device,op_name,kernel_source,moe_dtype,num_tokens,hidden_size,inter_size,topk,num_experts,\
moe_tp_size,moe_ep_size,distribution,latency
TRTLLM,1.0.0rc6,NVIDIA B200,moe,moe_torch_flow,nvfp4,64,4096,1536,8,128,1,1,uniform,0.25
TRTLLM,1.0.0rc6,NVIDIA B200,moe,moe_torch_flow,nvfp4,128,4096,1536,8,128,1,1,power_law_1.2,0.31
TRTLLM,1.0.0rc6,NVIDIA B200,moe,moe_torch_flow,fp8,64,4096,1536,8,128,2,2,uniform,0.2
"""


def test_the_older_wheels_csv_tables_are_read_by_version(tmp_path):
    folder = tmp_path / "aiconfigurator" / "systems" / "data" / "b200_sxm" / "trtllm" / "1.0.0rc6"
    folder.mkdir(parents=True)
    (folder / "moe_perf.txt").write_text(MOE_CSV)
    assert table_systems(str(tmp_path)) == ["b200_sxm"]
    tables = load_tables(str(tmp_path), "b200_sxm", "trtllm", "1.0.0rc6")
    moe = tables["moe"]
    # the TP x EP row is no one rank's work and is dropped; "uniform" is the newer tables' "balanced"
    assert [(r.tokens, r.dtype, r.distribution) for r in moe.rows] == [(64, "nvfp4", "balanced"),
                                                                       (128, "nvfp4", "power_law_1.2")]
    assert moe.seconds.tolist() == pytest.approx([0.25e-3, 0.31e-3])
    assert moe.source.endswith("b200_sxm/moe/trtllm/1.0.0rc6/moe_perf.parquet")
    with pytest.raises(KernelDBError, match="of version 1.3.0rc20"):
        load_tables(str(tmp_path), "b200_sxm", "trtllm", "1.3.0rc20")


def test_a_release_prices_the_moe_kernels_its_own_tables_measured():
    hw = load_profile("b200")
    newest, older = hw.engine("trtllm"), hw.at_engine_release("1.0").engine("trtllm")
    assert "1.0" in newest.releases and older.releases == {}
    assert older.moe != newest.moe and older.gemm == newest.gemm and older.decode_attention == newest.decode_attention
    assert "1.0.0rc6" in older.origin and "1.0.0rc6" in older.release
    assert not any(k.startswith("moe") for k in older.inherited)     # its MoE is its own fit, not vLLM's
    # TensorRT-LLM 1.0's fused bf16 MoE at Qwen3-235B's expert shape on one B200: 2.93 ms for 8192 tokens in its
    # tables, 1.3.0rc20's CUTLASS flow 2.22
    row = parse_row({"op": "moe", "tokens": 8192, "hidden": 4096, "inter": 1536, "experts": 128, "top_k": 8,
                     "tp": 1, "ep": 1, "dtype": "bf16"}, 1)
    assert price_rows(older, hw, [row])[0] > 1.2 * price_rows(newest, hw, [row])[0]
    # a release with no tables of its own, or the newest, prices with the newest fit
    for release in ("1.2", "0.17", None):
        assert hw.at_engine_release(release).engine("trtllm") == newest


def test_release_sections_are_checked_field_by_field():
    moe = load_profile("b200").engine("trtllm").releases["1.0"].to_json()
    with pytest.raises(ValueError, match="'1' is not a release"):
        parse_calibration("trtllm", {"releases": {"1": moe}}, "engines.trtllm")
    with pytest.raises(ValueError, match="fitted on release 1.0.0rc6, not 0.20"):
        parse_calibration("trtllm", {"releases": {"0.20": moe}}, "engines.trtllm")
    with pytest.raises(ValueError, match="no releases of its own"):
        parse_calibration("trtllm", {"releases": {"1.0": {**moe, "releases": {}}}}, "engines.trtllm")
    assert release_series("1.0.0rc6") == "1.0" and release_series("0.20.0") == "0.20"


def test_a_release_with_kernel_tables_and_no_rows_runs_at_the_nearest_older_overheads():
    from serving.step_cost import StepCost
    from tracer.model_source import resolve_model
    from tracer.work import TraceOptions
    assert nearest_release("trtllm", "1.0") == "0.20" and nearest_release("trtllm", "0.17") == "0.17"
    assert nearest_release("trtllm", None) is None
    cost = StepCost(resolve_model("qwen3-30b-a3b"), load_profile("b200"), TraceOptions(dtype="fp4"), "engine", 1,
                    "trtllm", release="1.0")
    assert cost.overhead_origin.startswith("TensorRT-LLM 0.20 (no TensorRT-LLM 1.0 end-to-end data: the nearest "
                                           "release's;")
    assert cost.hw.kernel_release == "1.0" and "1.0.0rc6" in cost.hw.engine("trtllm").origin


def test_text_generate_takes_a_release_that_has_only_kernel_tables(capsys):
    from cli.inference.text_generate import main
    args = ["qwen3-30b-a3b", "--device", "b200", "--dtype", "fp4", "-b", "64", "-c", "1000", "--decode", "--json"]
    assert main(args + ["--engine", "trtllm==1.0"]) == 0
    older = json.loads(capsys.readouterr().out)
    assert main(args + ["--engine", "trtllm"]) == 0
    newest = json.loads(capsys.readouterr().out)
    assert "1.0.0rc6" in older["origin"]["kernels"] and "1.0.0rc6" not in newest["origin"]["kernels"]
    assert older["latency_ms"] > newest["latency_ms"]


ROW = {"id": "x-0019", "source_kind": "gpustack_perflab_vllm_bench", "engine": "vLLM", "engine_version": "v0.13.0",
       "model": "deepseek-ai/DeepSeek-V3.2", "precision": "fp8 (native block-fp8 weights)", "kv_cache_dtype": None,
       "gpu": "H200-SXM-141GB", "num_gpus": 8, "tp": 1, "pp": 1, "ep": 8, "dp": 8, "attention_dp": True,
       "isl": 219.1, "osl": 197.1, "mode": "online_request_rate", "request_rate": None, "num_requests": 1000,
       "output_tok_s": 3003.9,
       "engine_flags": "vllm serve deepseek-ai/DeepSeek-V3.2 -tp 1 -dp 8 --enable-expert-parallel"}


def test_attention_dp_rows_are_ranks_whose_moe_is_one_ep_group():
    run, why = map_row(ROW)
    assert why is None
    assert (run.tp, run.replicas, run.ep, run.attention_dp, run.load.requests) == (1, 8, 8, True, 125)
    # SGLang's --tp-size 8 --dp-size 8 --enable-dp-attention --ep-size 8: the same ranks, attention TP 8 / 8
    sglang, why = map_row({**ROW, "engine": "SGLang", "engine_version": "v0.5.6", "tp": 8,
                           "engine_flags": "python3 -m sglang.launch_server --tp-size 8 --dp-size 8 "
                                           "--enable-dp-attention --ep-size 8"})
    assert why is None and (sglang.tp, sglang.replicas, sglang.ep) == (1, 8, 8)
    # without expert parallelism the MoE is TP across the ranks, which tracecost does not price
    tp_moe, why = map_row({**ROW, "engine": "SGLang", "tp": 8, "ep": None, "engine_flags": "--enable-dp-attention"})
    assert tp_moe is None and "tensor-parallel across the DP ranks" in why


@pytest.mark.parametrize("name, billions, moe_layers, experts", [("llama-4-maverick", 400.7, 24, 128),
                                                                  ("llama-4-scout", 107.8, 48, 16)])
def test_the_llama4_configs_hold_their_published_sizes(name, billions, moe_layers, experts):
    from tracer.model_source import resolve_model
    from tracer.trace import trace
    from tracer.work import Request
    spec = resolve_model(name)
    text = spec.config["text_config"]
    assert len(text["moe_layers"]) == moe_layers and text["num_local_experts"] == experts
    # the text model's weights (the vision encoder runs only on images): 400B and 109B as Meta states them
    t = trace(spec, Request(1, 1, 16))
    assert t.weight_bytes / 2e9 == pytest.approx(billions, abs=0.1)
    assert any("vision encoder's weights are not counted" in n for n in t.notes)     # said, not silently left out
    hf_id = "Llama-4-Maverick-17B-128E-Instruct" if experts == 128 else "Llama-4-Scout-17B-16E-Instruct"
    run, why = map_row({**ROW, "model": f"meta-llama/{hf_id}", "attention_dp": False, "dp": 1, "ep": None, "tp": 8,
                        "precision": "fp8", "engine_flags": "vllm serve m -tp 8"})
    assert why is None and run.model == name


def test_a_device_scaled_from_a_fit_scales_its_release_sections_too():
    from cost.engine_kernels.device_fit import DeviceScaling, scale_calibration, scale_params
    cal = load_profile("h200").engine("trtllm")
    s = DeviceScaling.from_json({"matrix": 1.0, "hbm": 0.5, "narrow_tiles": 1.0, "kernel_us": 0.0}, "test")
    scaled = scale_calibration(cal, s, "test")
    assert set(scaled.releases) == set(cal.releases) == {"0.20", "1.0"}
    expected = {k: scale_params(v, s) for k, v in cal.releases["1.0"].moe.items()}
    assert scaled.at_release("1.0").moe == expected != cal.releases["1.0"].moe


def test_the_newest_releases_candidates_are_merged_shape_by_shape(tmp_path):
    """TensorRT-LLM's 1.3.0rc23 MoE table times three new expert shapes and rc20 two dozen: each format and shape
    comes from the newest candidate of the newest release timing it, and nothing from an older release."""
    header = MOE_CSV.splitlines()[0]

    def table(version, shapes):
        folder = tmp_path / "aiconfigurator" / "systems" / "data" / "b200_sxm" / "trtllm" / version
        folder.mkdir(parents=True)
        lines = [f"TRTLLM,{version},NVIDIA B200,moe,moe_torch_flow,nvfp4,64,{h},{i},8,128,1,1,uniform,{ms}"
                 for h, i, ms in shapes]
        (folder / "moe_perf.txt").write_text("\n".join([header, *lines]) + "\n")

    table("1.3.0rc23", [(4096, 1536, 0.1)])
    table("1.3.0rc20", [(4096, 1536, 0.9), (2048, 768, 0.2)])
    table("1.2.0rc5", [(7168, 2048, 0.3)])
    moe = load_tables(str(tmp_path), "b200_sxm", "trtllm")["moe"]
    assert sorted((r.hidden, s * 1e3) for r, s in zip(moe.rows, moe.seconds)) == [(2048, pytest.approx(0.2)),
                                                                                (4096, pytest.approx(0.1))]
    assert "1.3.0rc20" in moe.source and "1.2.0rc5" not in moe.source
