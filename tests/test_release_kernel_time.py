"""A release's kernel time (cost/engines.py ServingOverheads.kernel_time): an older release built with older
kernels runs the same step's kernels slower, and only its kernels."""
from dataclasses import replace

import pytest

from cost.engines import resolve_overheads
from cost.profile import load_profile
from serving.calibrate_overheads import FITTED_TERMS, RELEASE_TERMS, coordinate_search
from serving.step_cost import StepCost
from tracer.model_source import resolve_model
from tracer.work import TraceOptions


def _cost(**overheads) -> StepCost:
    cost = StepCost(resolve_model("llama-3.2-1b"), load_profile("h100"), TraceOptions(), "engine", 1, "trtllm")
    cost.overheads = replace(cost.overheads, **overheads)
    return cost


def test_kernel_time_scales_the_kernels_and_not_the_host_work():
    base, slow = _cost(kernel_time=1.0), _cost(kernel_time=1.25)
    for decoding, prefill in ((8, 0), (64, 2048)):
        args = (decoding, prefill, 2048 if prefill else 1, 0.0, 1000.0)
        host = base.beyond_kernels(decoding + (1 if prefill else 0), decoding + prefill, 0.0, decode_only=not prefill)
        kernels = base.steady(*args) - host
        assert kernels > 0
        assert slow.steady(*args) - host == pytest.approx(1.25 * kernels, rel=1e-9)
    # the event simulator's fast path pays the same steps
    step = base.step([], 16, 16 * 500)
    assert slow.step([], 16, 16 * 500) > step


def test_the_kernel_time_is_a_release_term_only_and_said():
    assert "kernel_time" in RELEASE_TERMS and "kernel_time" not in FITTED_TERMS
    assert resolve_overheads("trtllm", "0.17").params.kernel_time == 1.0      # the kernel fits' own physics
    slow = _cost(kernel_time=1.2)
    fresh = StepCost(resolve_model("llama-3.2-1b"), load_profile("h100"), TraceOptions(), "engine", 1, "trtllm",
                     overheads=replace(slow.overheads))
    assert "1.2x the time the kernel fits give" in fresh.overhead_origin


class _Pool:
    """Prices a fake run whose loss is |log(kernel_time / 1.17)|: the search must get near it in its three rounds."""
    def map(self, runs, params):
        return [(_Run(), {"tpot_ms": 100.0 * params.kernel_time}, None)]


class _Run:
    measured = {"tpot_ms": 117.0}


def test_a_narrow_term_is_searched_in_small_steps():
    best, _ = coordinate_search([_Run()], _Pool(), replace(_cost().overheads, kernel_time=1.0), ["kernel_time"],
                                log=lambda m: None)
    assert abs(best.kernel_time - 1.17) < 0.05       # 4x steps would have stopped at a bound or at 1


def test_a_single_step_of_an_older_release_says_its_kernels_are_not_applied():
    from cli.inference.text_generate import release_kernels_warning
    from cost.engines import engine_releases
    slow = [r for r in engine_releases("trtllm") if resolve_overheads("trtllm", r).params.kernel_time != 1.0]
    assert slow, "a release with its own kernel time (TensorRT-LLM 0.9, fitted on MLPerf v4.0's Offline rows)"
    assert "x the kernel times shown" in release_kernels_warning("trtllm", slow[0])
    assert release_kernels_warning("trtllm", "0.17") is None


def test_text_generate_warns_only_where_the_release_kernel_time_is_not_applied(capsys):
    import json
    from cli.inference.text_generate import main
    step = ["llama-3.2-1b", "--device", "h100", "--engine", "trtllm==0.9", "--decode", "-b", "8", "-c", "1000", "--json"]
    assert main(step) == 0
    assert any("x the kernel times shown" in w for w in json.loads(capsys.readouterr().out)["warnings"])
    # a speculative step is priced by StepCost, which applies the release's kernel time: no such warning
    assert main(step + ["--speculative", "eagle3", "--num-speculative-tokens", "3", "--acceptance-rate", "0.7"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert not any("x the kernel times shown" in w for w in spec.get("warnings", []))
    assert "kernels take 1.17x" in spec["origin"]["overheads"]      # and says so


def test_a_device_fit_does_not_take_a_release_kernel_time():
    from serving.calibrate_serving import _overhead_names
    with pytest.raises(ValueError, match="release's own term"):
        _overhead_names("step_us,kernel_time", [])
