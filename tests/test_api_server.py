"""The HTTP server's serial intake (cost/engines.py ServingOverheads.frontend_ms): a burst enters the engine at
its pace, a stream faster than it is not served, and the steady state and the event simulation agree."""
from dataclasses import replace

import pytest

from cost.engines import ServingOverheads
from serving.engine_flags import stated_settings
from serving.simulator import ServerConfig, simulate
from serving.steady_state import MAX, RATE, Limits, Load, solve
from serving.step_cost import StepCost
from serving.workload import SimRequest
from cost.profile import load_profile
from tracer import TraceOptions, resolve_model


def fake_step(decoding, prefill_tokens, chunk_tokens, chunk_context, decode_context):
    return 0.010 + 1e-4 * decoding + 2e-6 * prefill_tokens


LIMITS = Limits(max_num_seqs=256, max_batched_tokens=8192, kv_tokens=1_000_000)


def test_a_burst_enters_at_the_servers_pace():
    free = solve(fake_step, 128, 4, 0, Load(MAX, requests=1000), LIMITS)
    paced = solve(fake_step, 128, 4, 0, Load(MAX, requests=1000), LIMITS, frontend_s=0.02)
    makespan = 1000 * 4 / paced.output_tokens_per_s
    assert makespan >= 1000 * 0.02                      # the last request enters after 1000 intakes
    assert makespan < 1000 * 0.02 + 4 * 0.04            # and is answered a few steps later
    assert free.output_tokens_per_s > 3 * paced.output_tokens_per_s
    # the server's queue: a request waits for the intake of every one before it (about half the burst)
    assert paced.ttft_s["mean"] > 0.45 * 1000 * 0.02 and "HTTP server" in paced.note


def test_a_stream_faster_than_the_server_is_not_served():
    ok = solve(fake_step, 128, 64, 0, Load(RATE, 40.0), LIMITS, frontend_s=0.02)
    over = solve(fake_step, 128, 64, 0, Load(RATE, 60.0), LIMITS, frontend_s=0.02)
    assert ok.stable and ok.ttft_s["mean"] > 0.02      # its own intake, and a wait behind others
    assert not over.stable and over.limited_by == "api server" and over.request_rate < 50.0
    base = solve(fake_step, 128, 64, 0, Load(RATE, 40.0), LIMITS)
    assert base.ttft_s["mean"] + 0.02 < ok.ttft_s["mean"]


def test_server_launch_lines_are_recognised():
    assert stated_settings("vllm serve Qwen/Qwen3-14B").api_server
    assert stated_settings("python3 -m sglang.launch_server --model-path x").api_server
    assert stated_settings("trtllm-serve Qwen/Qwen3-8B --backend pytorch").api_server
    assert stated_settings("vllm serve m --api-server-count 4").api_servers == 4
    assert not stated_settings("trtllm-bench build --dataset d").api_server
    assert not stated_settings("--max-num-seqs 256").api_server


def test_simulator_and_steady_state_agree_on_a_paced_burst():
    cost = StepCost(resolve_model("llama-3.2-1b"), load_profile("h100"), TraceOptions(), "engine", 1)
    cost.overheads = replace(cost.overheads, frontend_ms=10.0)
    n, prompt, out = 400, 256, 32
    requests = [SimRequest(i, 0.0, prompt, out) for i in range(n)]
    res = simulate(requests, cost, ServerConfig(max_running=256, max_prefill_tokens=8192, prefix_caching=False,
                                               gpu_blocks=200_000))
    sim_makespan = max(r.finish_s for r in res.records)
    limits = Limits(max_num_seqs=256, max_batched_tokens=8192, kv_tokens=3_000_000)
    state = solve(cost.steady, prompt, out, 0, Load(MAX, requests=n), limits, frontend_s=1e-2)
    model_makespan = n * out / state.output_tokens_per_s
    assert sim_makespan >= n * 1e-2
    assert abs(model_makespan / sim_makespan - 1) < 0.05, (model_makespan, sim_makespan)
    off = simulate(requests, cost, ServerConfig(max_running=256, max_prefill_tokens=8192, prefix_caching=False,
                                                gpu_blocks=200_000, api_server=False))
    assert max(r.finish_s for r in off.records) < 0.7 * sim_makespan


def test_serving_sim_takes_requests_through_the_server_unless_told(capsys):
    import json
    from cli.inference.serving_sim import main
    argv = ["llama-3.2-1b", "--device", "h100", "--workload", "multi-turn-chat", "--num-requests", "40",
            "--request-rate", "2", "--json"]
    assert main(argv) == 0
    served = json.loads(capsys.readouterr().out)
    assert main(argv + ["--no-api-server"]) == 0
    direct = json.loads(capsys.readouterr().out)
    ttft = [list(r["runs"].values())[0]["ttft_ms"]["mean"] for r in (served, direct)]
    frontend = StepCost(resolve_model("llama-3.2-1b"), load_profile("h100"), TraceOptions(), "engine", 1).overheads.frontend_ms
    assert frontend > 0 and ttft[0] - ttft[1] >= 0.9 * frontend


def _md1_p99(rho: float, service_s: float, n: int = 1_000_000) -> float:
    """The 99th percentile of an M/D/1 queue's wait, drawn: Lindley's recursion W' = max(0, W + D - A)."""
    import numpy as np
    gaps = np.random.default_rng(1).exponential(service_s / rho, n)
    waits, w = np.empty(n), 0.0
    for k, a in enumerate(gaps.tolist()):
        w = max(0.0, w + service_s - a)
        waits[k] = w
    return float(np.percentile(waits[n // 10:], 99))


def test_the_servers_queue_has_the_md1_tail():
    import math
    import numpy as np
    from serving.load_queue import md1_tail, waits_above
    for rho in (0.2, 0.5, 0.8):
        c, theta = md1_tail(rho, 0.02)
        assert math.log(c / 0.01) / theta == pytest.approx(_md1_p99(rho, 0.02), rel=0.04)
    # three waits at once (the slot, the prefill queue, the server) against draws of their sum
    waits = [(0.3, 20.0), (0.5, 50.0), (0.4, 20.0)]
    rng = np.random.default_rng(0)
    total = sum((rng.random(400_000) < b) * rng.exponential(1 / th, 400_000) for b, th in waits)
    for t in (0.0, 0.05, 0.1, 0.2):
        assert float(waits_above(np.array([t]), waits)[0]) == pytest.approx((total > t).mean(), abs=0.003)


def test_p99_ttft_behind_the_server_agrees_with_the_event_simulation():
    """Short requests at half the server's pace: the p99 TTFT is mostly the server's queue, whose tail the steady
    state once left out (it added the mean wait to every percentile)."""
    import random
    from serving.workload import arrival_times
    cost = StepCost(resolve_model("llama-3.2-1b"), load_profile("h100"), TraceOptions(), "engine", 1)
    cost.overheads = replace(cost.overheads, frontend_ms=20.0)
    rate, n, prompt, out = 25.0, 4000, 128, 16
    times = arrival_times(n, rate, random.Random(0), "poisson")
    requests = [SimRequest(i, t, prompt, out) for i, t in enumerate(times)]
    res = simulate(requests, cost, ServerConfig(max_running=256, max_prefill_tokens=8192, prefix_caching=False,
                                               gpu_blocks=200_000))
    ttfts = sorted(r.ttft_s for r in res.records)
    simulated = ttfts[int(0.99 * len(ttfts))]
    state = solve(cost.steady, prompt, out, 0, Load(RATE, rate), LIMITS, cost.overheads.request_ms * 1e-3,
                  frontend_s=0.02)
    assert abs(state.ttft_s["p99"] / simulated - 1) < 0.12, (state.ttft_s, simulated)
    assert state.ttft_s["p99"] - state.ttft_s["p50"] > 0.04      # the server's tail, not its mean
