"""Progress on stderr only for a terminal (cli/progress.py), fed through callbacks by the simulator."""
import json
import sys

import pytest

from cli.inference.serving_sim import main as serving_sim
from cli.progress import Progress
from cost.profile import load_profile
from serving.simulator import ServerConfig, StepCost, simulate
from serving.workload import SimRequest
from tracer import TraceOptions, resolve_model


def test_quiet_off_a_terminal(capsys):
    with Progress(3, "work", delay_s=0) as bar:   # pytest's stderr is not a terminal
        assert not bar.active
        bar.update()
        bar.set(3, 3)
    assert capsys.readouterr().err == ""


def test_drawn_on_a_terminal(capsys):
    pytest.importorskip("tqdm")
    with Progress(4, "tracing", enabled=True, delay_s=0) as bar:
        bar.set(2)
        bar.set(4, 4)
    err = capsys.readouterr().err
    assert "tracing" in err and "/4" in err


def test_simulator_reports_done_of_total():
    cost = StepCost(resolve_model("llama-3.2-1b"), load_profile("h100"), TraceOptions(), "engine", 1)
    requests = [SimRequest(i, i * 0.5, 256, 64, segments=[(f"u{i}", 256)]) for i in range(40)]
    seen = []
    simulate(requests, cost, ServerConfig(max_running=4), on_progress=lambda done, total: seen.append((done, total)))
    assert len(seen) > 1 and seen[-1] == (40, 40)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and all(t == 40 for _, t in seen)


def test_json_stdout_stays_clean_on_a_terminal(monkeypatch, capsys):
    pytest.importorskip("tqdm")
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    monkeypatch.setattr("cli.progress.DELAY_S", 0.0)
    assert serving_sim(["llama-3.2-1b", "--device", "h100", "--workload", "shared-system-prompt",
                        "--num-requests", "30", "--jobs", "1", "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["num_requests"] == 30
    assert "simulating" in out.err
