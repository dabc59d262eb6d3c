"""SGLang speculates without its overlap scheduler (server_args.py): the scheduler's host work runs in series with
the GPU in every speculative step (serving/speculative.py SerialHost), in SGLang only."""
import pytest

from cost.profile import load_profile
from serving.calibrate_serial_host import split
from serving.speculative import SerialHost, parse_speculation, serial_host, speculative_step, step_times
from serving.step_cost import StepCost
from tracer import TraceOptions, resolve_model


def _step(engine: str, method: str = "eagle3"):
    cost = StepCost(resolve_model("llama-3.2-1b"), load_profile("h100"), TraceOptions(), "engine", 1, engine)
    return speculative_step(cost, parse_speculation(method, 3, acceptance_rate=0.7))


def test_sglang_speculative_step_pays_its_host_work_in_series():
    step = _step("sglang")
    host, origin = serial_host("sglang")
    assert step.serial_host == host and host.step_us > 0 and "server_args.py" in origin
    n = 6
    with_host = step.steady(n, 0, 1, 0, 700)
    step.serial_host = None
    without = step.steady(n, 0, 1, 0, 700)
    assert with_host - without == pytest.approx((host.step_us + host.seq_us * n) * 1e-6, rel=1e-9)
    # a prompt chunk beside the decodes is one more request the scheduler handles
    step.serial_host = host
    mixed = step.steady(n, 1024, 512, 0, 700)
    step.serial_host = None
    assert mixed - step.steady(n, 1024, 512, 0, 700) == pytest.approx((host.step_us + host.seq_us * (n + 2)) * 1e-6)


def test_times_and_notes_show_the_host_work():
    step = _step("sglang")
    t = step_times(step, 4, 512)
    assert t.serial_host_s == pytest.approx(step.serial_host.seconds(4))
    assert t.step_s == pytest.approx(t.draft_s + t.verify_s + t.serial_host_s)
    assert t.step_s == pytest.approx(step.steady(4, 0, 1, 0, 512))
    assert t.as_json()["serial_host_ms"] == pytest.approx(t.serial_host_s * 1e3)
    assert any("without its overlap scheduler" in n for n in step.formats_notes())
    # the plain SGLang step keeps its overlap scheduler: the same plain step either way
    assert t.plain_s == pytest.approx(step.target.steady(4, 0, 1, 0, 512))


@pytest.mark.parametrize("engine", ["vllm", "trtllm"])
def test_engines_that_overlap_while_speculating_pay_none(engine):
    step = _step(engine)
    assert step.serial_host is None and serial_host(engine) is None
    assert step_times(step, 4, 512).serial_host_s == 0.0
    assert not any("overlap scheduler" in n for n in step.formats_notes())


def test_host_work_outside_its_physical_range_is_refused_by_name():
    with pytest.raises(ValueError, match="seq_us"):
        SerialHost.from_json({"step_us": 100.0, "seq_us": 400.0}, "speculative.json: serial_host.sglang")
    assert SerialHost(1000.0, 20.0).seconds(0) == 0.0
    assert SerialHost(1000.0, 20.0).seconds(3) == pytest.approx(1.06e-3)


def test_fit_and_held_out_rows_are_disjoint_and_seeded():
    class Run:
        def __init__(self, i):
            self.id = f"r{i:02d}"
    runs = [Run(i) for i in range(15)]
    fit, held = split(runs, 0, 0.5)
    assert {r.id for r in fit}.isdisjoint(r.id for r in held) and len(fit) + len(held) == 15
    assert [r.id for r in split(list(reversed(runs)), 0, 0.5)[0]] == [r.id for r in fit]
    assert len(split(runs[:2], 0, 0.9)[1]) == 1
