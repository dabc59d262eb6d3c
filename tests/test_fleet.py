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
