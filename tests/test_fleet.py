"""Issue 20: engines only where they run, the fleet's profiles, the origin of every number, rack-scale domains."""
from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from cost.engines import ENGINES, engine_refusal, engines_on
from cost.profile import ProfileError, load_profile


def _run(main, argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def test_engines_name_the_vendors_they_run_on():
    assert ENGINES["trtllm"].vendors == ("NVIDIA",)
    assert set(ENGINES["vllm"].vendors) == set(ENGINES["sglang"].vendors) == {"NVIDIA", "AMD"}
    assert engines_on("NVIDIA") == list(ENGINES)
    assert engines_on("AMD") == ["vllm", "sglang"]
    assert engines_on("Huawei") == []
    assert engine_refusal("vllm", "", "a custom part") is None    # unknown vendor: not refused


@pytest.mark.parametrize("device, engine", [("mi300x", "trtllm"), ("ascend910b", "trtllm"), ("ascend910b", "vllm"),
                                            ("ascend910b", "sglang")])
def test_an_engine_the_device_cannot_run_is_refused(device, engine):
    hw = load_profile(device)
    with pytest.raises(ProfileError) as e:
        hw.engine(engine)
    msg = str(e.value)
    assert "\n" not in msg and ENGINES[engine].label in msg and hw.name in msg
    if hw.vendor == "Huawei":
        assert "vLLM-Ascend" in msg and "MindIE" in msg


def test_engines_that_run_are_not_refused():
    assert load_profile("mi300x").engine("vllm").origin
    assert load_profile("mi300x").engine("sglang").origin
    assert load_profile("h100").engine("trtllm").origin.startswith("fitted")


ROW = '{"op":"gemm","m":16,"n":4096,"k":4096,"dtype":"bf16"}\n'


@pytest.mark.parametrize("device, engine", [("mi300x", "trtllm"), ("ascend910b", "vllm")])
def test_every_command_refuses_in_one_line(tmp_path, device, engine):
    from cli.inference import serving_sim, text_generate, throughput_optimizer
    from cost import kernel
    rows = tmp_path / "rows.jsonl"
    rows.write_text(ROW)
    common = ["--device", device, "--engine", engine]
    for main, argv in [
        (text_generate.main, ["llama-3.1-8b", *common]),
        (throughput_optimizer.main, ["llama-3.1-8b", *common, "--num-devices", "1", "--input-length", "128",
                                     "--output-length", "128"]),
        (serving_sim.main, ["llama-3.1-8b", *common, "--workload", "multi-turn-chat", "--num-requests", "20"]),
        (kernel.main, [*common, "--jsonl", str(rows)]),
    ]:
        rc, out, err = _run(main, argv)
        assert rc == 2, (main, err)
        assert out == "" and len(err.strip().splitlines()) == 1 and "runs on" in err, err


def test_hw_profiles_lists_refused_engines():
    from hw_profiles.__main__ import main
    rc, out, _ = _run(main, ["ascend910b", "--json"])
    assert rc == 0
    entry = json.loads(out)[0]
    assert entry["engines"] == {} and set(entry["refused_engines"]) == set(ENGINES)
    rc, out, _ = _run(main, ["mi300x"])
    assert rc == 0 and "engine trtllm: refused" in out and "engine vllm (from h100 scaled): carried over" in out


FLEET = ("gb200", "gb300", "b300", "h200nvl", "h100nvl", "h100pcie", "gh200", "gh200_96gb", "rtxpro6000", "mi325x",
         "mi355x", "ascend910c", "l4", "h20", "ascend910b")
SOURCED = ("matrix_tflops", "vector_tflops", "memory", "interconnect", "host_link", "compute_units", "scale_out")


@pytest.mark.parametrize("key", FLEET)
def test_fleet_profiles_load_with_a_source_per_number(key):
    import json as _json
    from cost.profile import profiles_dir
    raw = _json.loads((profiles_dir() / f"{key}.json").read_text())
    hw = load_profile(key)
    missing = [s for s in SOURCED if s in raw or s != "scale_out"]
    assert all(hw.sources.get(s) for s in missing), [s for s in missing if not hw.sources.get(s)]
    assert "fp8" not in hw.matrix_tflops or hw.matrix_tflops["fp8"] >= hw.matrix_tflops["bf16"]
    # without a fit of its own the profile names its nearest fitted sibling, and every engine says so
    assert "from" in raw["efficiency"] and hw.efficiency.origin.startswith("carried over")
    if key in ("gb200", "gb300", "b300", "rtxpro6000"):    # fitted on AIConfigurator 0.12's tables
        system = {"b300": "b300_sxm", "rtxpro6000": "rtx_pro_6000_server"}.get(key, key)
        assert hw.engine("vllm").origin.startswith("fitted") and system in hw.engine("vllm").origin
        if key in ("b300", "rtxpro6000"):
            return
        trtllm = hw.engine("trtllm").origin
        assert trtllm.startswith("fitted") and system in trtllm
        return
    assert "from" in raw["engines"]
    for name in ENGINES:
        if engine_refusal(name, hw.vendor, hw.name) is None:
            assert "carried over" in hw.engine(name).origin, (key, name)


def test_fleet_scale_up_domains_and_host_links():
    assert load_profile("gb200").scale_up_gpus == load_profile("gb300").scale_up_gpus == 72
    assert load_profile("gb200").gpus_per_node == 4       # --nodes counts compute trays of 4 GPUs
    assert load_profile("h100nvl").scale_up_gpus == 2 and load_profile("h200nvl").scale_up_gpus == 4
    assert load_profile("h100").scale_up_gpus == 8        # no domain given: the node
    assert load_profile("ascend910c").scale_up_gpus == 384
    for key in ("gh200", "gh200_96gb", "gb200", "gb300"):
        hw = load_profile(key)
        assert "C2C" in hw.host_link_name and hw.host_link_bandwidth_gbps == 450
    for key in ("gb200", "gb300", "b300", "rtxpro6000", "mi355x"):
        assert "fp4" in load_profile(key).matrix_tflops
    assert load_profile("gh200-144gb").memory_capacity_gb == 144 and load_profile("gh200-96gb").memory_capacity_gb == 96


def test_a_scale_up_domain_is_validated():
    import json as _json
    from cost.profile import parse_profile, profiles_dir
    data = _json.loads((profiles_dir() / "gb200.json").read_text())
    data["interconnect"]["domain_gpus"] = 0
    with pytest.raises(ProfileError, match="interconnect.domain_gpus"):
        parse_profile(data, "bad", "bad.json")


def test_budgets_take_the_memory_the_driver_reports():
    """Engines size their budgets on the total CUDA reports, below the datasheet's: sourced where reported (every
    profile says where), else USABLE_SHARE of the datasheet's; a reported total above the datasheet's is refused."""
    import json as _json
    from cost.profile import USABLE_SHARE, parse_profile, profile_names, profiles_dir
    assert load_profile("h100").memory_bytes == pytest.approx(79.19 * 2**30)
    assert load_profile("l40s").memory_bytes == pytest.approx(44.39 * 2**30)      # "48 GB" is decimal
    gb200 = load_profile("gb200")
    assert not gb200.memory_usable_stated
    assert gb200.memory_bytes == pytest.approx(186 * USABLE_SHARE * 2**30)
    for key in profile_names():
        hw = load_profile(key)
        assert hw.memory_bytes <= hw.memory_capacity_gb * 2**30 and hw.sources.get("memory_usable"), key
    data = _json.loads((profiles_dir() / "h100.json").read_text())
    data["memory"]["usable_gib"] = 81.0
    with pytest.raises(ProfileError, match="usable_gib"):
        parse_profile(data, "bad", "bad.json")


def test_collectives_inside_an_nvl72_stay_on_nvlink():
    from cost.parallel import cross_node_all_reduce_seconds, group_all_to_all_seconds, nodes_spanned
    gb200, b200 = load_profile("gb200"), load_profile("b200")
    assert nodes_spanned(72, gb200) == 1 and nodes_spanned(73, gb200) == 2
    assert cross_node_all_reduce_seconds(1e8, 72, gb200) == 0.0
    assert cross_node_all_reduce_seconds(1e8, 72, b200) > 0.0
    # an all-to-all over 72 GPUs: NVLink at 900 GB/s in the rack, the 50 GB/s NICs across 9 HGX B200 nodes
    assert group_all_to_all_seconds(1e8, 72, gb200) < group_all_to_all_seconds(1e8, 72, b200) / 5


def test_published_gpu_names_map_to_the_new_profiles():
    from serving.published_rows import DEVICES
    for name in ("GH200-144GB", "GH200-96GB", "H100-NVL-94GB", "H100-PCIe-80GB"):
        assert load_profile(DEVICES[name]).key == DEVICES[name]


def test_origin_names_the_fitted_sibling(tmp_path):
    from cost.provenance import kernel_origin
    fitted = kernel_origin(load_profile("h100"), "vllm")
    assert not fitted.carried_over and fitted.headline() is None
    assert not kernel_origin(load_profile("b200"), "trtllm").carried_over     # fitted on its own tables
    # a profile without a TensorRT-LLM section prices it on this device's vLLM fit, and says so
    data = json.loads((Path(__file__).parents[1] / "hw_profiles" / "b200.json").read_text())
    del data["engines"]["trtllm"]
    (tmp_path / "b200.json").write_text(json.dumps(data))
    b200 = kernel_origin(load_profile(str(tmp_path / "b200.json")), "trtllm")
    assert b200.carried_over and b200.fitted_on == "NVIDIA B200 (HGX)" and b200.kernels_engine == "vllm"
    assert b200.headline() == ("carried over: TensorRT-LLM kernel models on NVIDIA B200 (HGX) are vLLM's fit "
                               "(no TensorRT-LLM fit on this device)")
    assert not kernel_origin(load_profile("b300"), "trtllm").carried_over     # fitted on its own tables
    nvl = kernel_origin(load_profile("h200nvl"), "vllm")
    assert nvl.carried_over and nvl.fitted_on == "NVIDIA H200 SXM" and "H200 SXM" in nvl.headline()
    rtx = kernel_origin(load_profile("rtx4090"), "trtllm")     # another device's fit of the same engine
    assert rtx.carried_over and rtx.fitted_on == "NVIDIA L40S" and rtx.kernels_engine == "trtllm"
    assert not kernel_origin(load_profile("gb200"), "trtllm").carried_over
    mi = kernel_origin(load_profile("mi325x"), "vllm")
    assert mi.fitted_on == "NVIDIA H100 SXM" and mi.scaled_on == ("AMD Instinct MI300X",)
    eager = kernel_origin(load_profile("h100"), None)
    assert eager.carried_over and eager.fitted_on == "NVIDIA H200 SXM"
    assert not kernel_origin(load_profile("h200"), None).carried_over


def test_python_api_estimate_carries_its_origin():
    from cost.estimate import estimate
    from tracer import Request, TraceOptions, trace
    step = trace("llama-3.2-1b", Request(1, 16, 0), TraceOptions())
    carried = estimate(step, load_profile("h200nvl"), "engine", engine="vllm")
    assert carried.origin.carried_over and carried.notes[0] == carried.origin.headline()
    own = estimate(step, load_profile("h100"), "engine", engine="vllm")
    assert not own.origin.carried_over and not own.notes[0].startswith("carried over")


CARRIED = "gh200_96gb"     # kernel models from the H100 SXM fit


def test_every_command_says_first_when_its_numbers_are_carried_over(tmp_path):
    from cli.inference import serving_sim, text_generate, throughput_optimizer
    from cost import kernel
    rows = tmp_path / "rows.jsonl"
    rows.write_text(ROW)
    model = ["llama-3.2-1b", "--device", CARRIED]
    commands = [
        (text_generate.main, model + ["--query-length", "64"]),
        (throughput_optimizer.main, model + ["--num-devices", "1", "--input-length", "128", "--output-length", "32"]),
        (serving_sim.main, model + ["--workload", "random", "--num-requests", "8"]),
    ]
    for main, argv in commands:
        rc, out, _ = _run(main, argv)
        assert rc == 0, (main, argv)
        first = out.splitlines()[0]
        assert first.startswith("carried over:") and "NVIDIA H100 SXM" in first, first
        assert any(line.startswith("note: ") and "kernels: carried over from the NVIDIA H100 SXM fit" in line
                   or line.startswith("note: kernel numbers: carried over from the NVIDIA H100 SXM fit")
                   for line in out.splitlines()), out
        rc, out, _ = _run(main, argv + ["--json"])
        origin = json.loads(out)["origin"]
        assert rc == 0 and origin["carried_over"] is True and origin["fitted_on"] == "NVIDIA H100 SXM"
        assert origin["headline"].startswith("carried over:")
    rc, out, err = _run(kernel.main, ["--device", CARRIED, "--jsonl", str(rows)])
    assert rc == 0 and err.splitlines()[0].startswith("carried over:")
    row = json.loads(out)
    assert row["carried_over"] is True and row["kernels_fitted_on"] == "NVIDIA H100 SXM" and row["ms"] > 0
    # a fitted device says nothing of the kind
    rc, out, err = _run(kernel.main, ["--device", "h100", "--jsonl", str(rows)])
    assert rc == 0 and not err.startswith("carried over") and json.loads(out)["carried_over"] is False


def test_hw_profiles_shows_the_fit_per_engine():
    from hw_profiles.__main__ import main
    rc, out, _ = _run(main, [])
    assert rc == 0
    line = next(l for l in out.splitlines() if l.startswith("gb300 "))
    assert "vllm fitted" in line and "sglang fitted" in line and "trtllm fitted" in line
    line = next(l for l in out.splitlines() if l.startswith("b300 "))
    assert "vllm fitted" in line and "sglang fitted" in line and "trtllm fitted" in line
    line = next(l for l in out.splitlines() if l.startswith("b200 "))
    assert "vllm fitted" in line and "sglang fitted" in line and "trtllm fitted" in line
    line = next(l for l in out.splitlines() if l.startswith("gh200 "))
    assert "vllm from h200, sglang from h200, trtllm from h200" in line
    line = next(l for l in out.splitlines() if l.startswith("h100 "))
    assert "vllm fitted (moe.fp8 from h200), sglang fitted, trtllm fitted" in line
    line = next(l for l in out.splitlines() if l.startswith("a100 "))
    assert "vllm fitted (moe.int4 from this device (sglang)), sglang fitted" in line
    rc, out, _ = _run(main, ["mi300x", "--json"])
    engines = json.loads(out)[0]["engines"]
    assert engines["vllm"]["fit"] == "from h100 scaled" and "trtllm" not in engines


def test_redundant_expert_slots_when_ep_does_not_divide_the_experts():
    from cost.execution import expert_slots
    from serving.layouts import LayoutSpace, layouts
    assert expert_slots(256, 72) == 288 and expert_slots(256, 64) == 256 and expert_slots(8, 1) == 8
    plan = layouts(72, 128, 256, LayoutSpace(attention_dp="on"))
    assert any(l.attention_dp and l.ep == 72 and l.tp == 1 for l in plan)


def test_deepseek_r1_attention_dp_and_ep_over_an_nvl72_is_searched_on_nvlink():
    """The done-when of issue 20: DeepSeek-R1 (V3's architecture) with attention-DP + EP over 72 GB200 GPUs."""
    from cli.inference import throughput_optimizer
    argv = ["deepseek-v3", "--device", "gb200", "--num-devices", "72", "--engine", "trtllm", "--attention-dp", "on",
            "--tp-sizes", "1", "--input-length", "256", "--output-length", "64", "--kv-cache-dtype", "fp8", "--json"]
    rc, out, _ = _run(throughput_optimizer.main, argv)
    assert rc == 0
    r = json.loads(out)
    assert r["scale_up_domains"] == 1 and r["nodes"] == 18 and not r["origin"]["carried_over"]
    c = r["candidates"][0]
    assert c["attention_dp"] and c["ep_size"] == 72 and c["dp_size"] == 72 and c["output_tokens_per_s"] > 0
    # the same step's collectives on NVLink (one NVL72) cost less than over 9 HGX B200 nodes on InfiniBand
    from cost.estimate import Parallelism, estimate
    from tracer import Request, TraceOptions, trace
    step = trace("deepseek-v3", Request(8, 1, 1024, decode=True), TraceOptions(kv_cache_dtype="fp8"))
    par = Parallelism(1, 72, "all-tokens", 1, 72)
    rack = estimate(step, load_profile("gb200"), "engine", par, engine="vllm")
    nodes = estimate(step, load_profile("b200"), "engine", par, engine="vllm")
    assert rack.breakdown_s["communication"] < nodes.breakdown_s["communication"] / 2
    assert any("72-GPU scale-up domain" in n for n in rack.notes)
    assert any("crosses" in n and "scale-out" in n for n in nodes.notes)
    assert any("288 expert slots" in n for n in rack.notes)


@pytest.mark.parametrize("device, link", [("gb200", "NVLink 5 through NVLink Switch trays"), ("b200", "ConnectX-7")])
def test_disaggregated_kv_moves_on_nvlink_inside_the_domain(device, link):
    from cli.inference import throughput_optimizer
    argv = ["llama-3.2-1b", "--device", device, "--num-devices", "16", "--mode", "disagg", "--tp-sizes", "1",
            "--input-length", "512", "--output-length", "32", "--json"]
    rc, out, _ = _run(throughput_optimizer.main, argv)
    assert rc == 0
    notes = [n for c in json.loads(out)["candidates"] for n in c["notes"] if n.startswith("KV transfer")]
    assert notes and all(link in n for n in notes), notes


@pytest.mark.parametrize("system, engine", [("gb200", "vllm"), ("gb200", "trtllm"), ("gb200", "sglang"),
                                            ("gb300", "vllm"), ("gb300", "sglang"), ("b300_sxm", "vllm"),
                                            ("b300_sxm", "sglang"), ("b300_sxm", "trtllm"),
                                            ("rtx_pro_6000_server", "vllm"), ("rtx_pro_6000_server", "sglang"),
                                            ("rtx_pro_6000_server", "trtllm"), ("b200_sxm", "sglang"),
                                            ("l40s", "trtllm"), ("gb300", "trtllm"), ("b200_sxm", "trtllm")])
def test_nvl72_fits_predict_held_out_table_rows(system, engine):
    """Fitted on a seeded half of AIConfigurator 0.12's tables; these rows are from the other half."""
    import numpy as np
    from pathlib import Path
    from cost.kernel_rows import parse_row, price_rows
    lines = (Path(__file__).parent / "data" / "kernel_tables" / f"{system}_{engine}.jsonl").read_text().splitlines()
    objs = [json.loads(line) for line in lines]
    hw = load_profile({"b300_sxm": "b300", "rtx_pro_6000_server": "rtxpro6000", "b200_sxm": "b200"}.get(system, system))
    cal = hw.engine(engine)
    assert cal.origin.startswith("fitted") and system in cal.origin
    rows = [parse_row(o, i) for i, o in enumerate(objs, 1)]
    err = np.abs(price_rows(cal, hw, rows) / np.array([o["measured_ms"] * 1e-3 for o in objs]) - 1.0)
    assert np.all(np.isfinite(err))
    assert np.median(err) < 0.15 and np.percentile(err, 90) < 0.6, (np.median(err), np.percentile(err, 90))
