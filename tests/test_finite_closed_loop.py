"""A finite closed loop, N requests by C users (`vllm bench serve --max-concurrency C --num-prompts N`): its
throughput counts the ramp and the drain (serving/steady_state.py finite_run, walked by serving/step_walk.py)."""
import json
from dataclasses import replace
from pathlib import Path

import pytest

from cost.profile import load_profile
from serving.layouts import Layout
from serving.lengths import bundled
from serving.published import map_row
from serving.search import EngineSettings, LatencyLimits, Searcher, Workload
from serving.steady_state import CONCURRENCY, Load, solve
from serving.step_walk import walk
from serving.verify import simulate_candidate
from tracer import TraceOptions, resolve_model


CURATED = Path(__file__).resolve().parents[1] / "bench" / "data" / "speculative_published.jsonl"


def constant_step(decoding, prefill):
    return 0.010


@pytest.mark.parametrize("users, resend_s", [(1, 0.0), (2, 0.0), (2, 0.005), (3, 0.0)])
def test_a_capped_client_sends_each_request_when_a_user_is_free(users, resend_s):
    """Six requests of a 1-step prompt and 5 outputs (4 decode steps): a request occupies its user for 5 steps of
    10 ms plus the server's resend time, so six requests by `users` users take ceil(6 / users) such turns; each
    TTFT is its own prefill step, counted from when it was sent, not from when it was ready."""
    waits, tpots, makespan = walk(constant_step, [0.0] * 6, [(100, 5)] * 6, admit=64, budget=8192, chunked=True,
                                  users=users, resend_s=resend_s)
    turns = -(-6 // users)
    assert makespan == pytest.approx(turns * 0.050 + (turns - 1) * resend_s, abs=0.0105)
    assert all(w == pytest.approx(0.010, abs=0.0105) for w in waits)
    assert len(tpots) == 6
    uncapped = walk(constant_step, [0.0] * 6, [(100, 5)] * 6, admit=64, budget=8192, chunked=True)
    assert uncapped[2] == pytest.approx(0.050, abs=0.0105) and max(uncapped[0]) == pytest.approx(0.010, abs=1e-9)


def _searcher(lengths=None):
    w = Workload(200, 150, lengths=lengths) if lengths else Workload(200, 150)
    return Searcher(resolve_model("llama-3.1-8b"), load_profile("h100"), TraceOptions(), w, EngineSettings(),
                    LatencyLimits())


@pytest.mark.parametrize("lengths", [None, "mlperf-llama2-70b"])
def test_a_finite_closed_loop_agrees_with_the_event_simulation(lengths):
    """80 requests by 8 users on one H100: the walked run's tokens/s is the event simulator's within 4%. With MLPerf's
    spread of outputs the last requests drain alone (the run keeps 0.956 of its steady state, from the expected
    sample of 80: serving/lengths.py stratified); with fixed lengths the 8 users finish together and their next
    requests share the HTTP server, a chat's 12 ms intake each (0.924)."""
    s = _searcher(bundled(lengths) if lengths else None)
    layout, load = Layout(1), Load(CONCURRENCY, 8, requests=80)
    cost = s.cost(layout)
    limits, _ = s.engine_limits(layout)
    args = (cost.steady, s.w.input_tokens, s.w.output_tokens, 0)
    kwargs = dict(lengths=s.w.lengths, frontend_s=cost.intake_s())
    finite = solve(*args, load, limits, cost.overheads.request_ms * 1e-3, **kwargs)
    endless = solve(*args, replace(load, requests=0), limits, cost.overheads.request_ms * 1e-3, **kwargs)
    sim = simulate_candidate(s, s.mixed(layout, load), load)
    assert sim["requests"] == 80
    assert finite.output_tokens_per_s == pytest.approx(sim["output_tokens_per_s"], rel=0.04)
    loss = finite.output_tokens_per_s / endless.output_tokens_per_s
    assert loss < 0.975     # the drain; with fixed lengths the users also finish together, and their next
    #                         requests share the HTTP server (serving/server_intake.py)
    assert "80 requests by 8 users" in finite.note and finite.ttft_s == endless.ttft_s


def test_a_published_concurrency_row_is_its_finite_run_paced_at_its_rate():
    row = json.loads(next(line for line in CURATED.read_text().splitlines()
                          if '"vllm_pr24322-h100pcie-x2-llama3.3-70b-eagle3-k7-c8"' in line))
    run, why = map_row(row)
    assert why is None
    assert run.load == Load(CONCURRENCY, 8.0, requests=80, send_rate=8.0)


def test_the_optimizer_takes_num_requests_with_concurrency(capsys):
    from cli.inference.throughput_optimizer import main
    assert main(["llama-3.1-8b", "--device", "h100", "--num-devices", "1", "--input-length", "200",
                 "--output-length", "150", "--concurrency", "8", "--num-requests", "80", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["load"]["requests"] == 80
    assert any("80 requests by 8 users" in n for n in out["best"]["notes"])


def test_a_run_of_fewer_requests_than_users_runs_only_its_requests():
    s = _searcher()
    layout = Layout(1)
    cost = s.cost(layout)
    limits, _ = s.engine_limits(layout)
    state = solve(cost.steady, 200, 150, 0, Load(CONCURRENCY, 3, requests=2), limits,
                  cost.overheads.request_ms * 1e-3)
    assert state.running == 2 and "2 requests by 3 users" in state.note
