"""Issue 20: engines only where they run, the fleet's profiles, the origin of every number, rack-scale domains."""
from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout

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
        (serving_sim.main, ["llama-3.1-8b", *common, "--workload", "chat"]),
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
    assert rc == 0 and "engine trtllm: refused" in out and "engine vllm: carried over" in out


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
    assert "from" in raw["efficiency"] and "from" in raw["engines"]
    assert hw.efficiency.origin.startswith("carried over")
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


def test_collectives_inside_an_nvl72_stay_on_nvlink():
    from cost.parallel import cross_node_all_reduce_seconds, group_all_to_all_seconds, nodes_spanned
    gb200, b200 = load_profile("gb200"), load_profile("b200")
    assert nodes_spanned(72, gb200) == 1 and nodes_spanned(73, gb200) == 2
    assert cross_node_all_reduce_seconds(1e8, 72, gb200) == 0.0
    assert cross_node_all_reduce_seconds(1e8, 72, b200) > 0.0
    # an all-to-all over 72 GPUs: NVLink at 900 GB/s in the rack, the 50 GB/s NICs across 9 HGX B200 nodes
    assert group_all_to_all_seconds(1e8, 72, gb200) < group_all_to_all_seconds(1e8, 72, b200) / 5


def test_published_gpu_names_map_to_the_new_profiles():
    from serving.published import DEVICES
    for name in ("GH200-144GB", "GH200-96GB", "H100-NVL-94GB", "H100-PCIe-80GB"):
        assert load_profile(DEVICES[name]).key == DEVICES[name]
