"""The HTTP server's intake (cost/engines.py ServingOverheads.frontend_ms, chat_template_ms): a burst enters the
engine once the server has taken it all in, a stream faster than it is not served, and the steady state and the
event simulation agree."""
from dataclasses import replace

import pytest

from serving.engine_flags import stated_settings
from serving.simulator import ServerConfig, simulate
from serving.server_intake import server_entries
from serving.steady_state import MAX, RATE, Limits, Load, solve
from serving.step_cost import StepCost
from serving.workload import SimRequest
from cost.profile import load_profile
from tracer import TraceOptions, resolve_model


def fake_step(decoding, prefill_tokens, chunk_tokens, chunk_context, decode_context):
    return 0.010 + 1e-4 * decoding + 2e-6 * prefill_tokens


LIMITS = Limits(max_num_seqs=256, max_batched_tokens=8192, kv_tokens=1_000_000)


def test_a_burst_enters_together_once_the_server_has_taken_it_in():
    """The server's event loop takes every queued request in before it resumes any hand-off to the engine: the
    engine then serves the burst as if it had come at once, 1000 intakes late."""
    free = solve(fake_step, 128, 4, 0, Load(MAX, requests=1000), LIMITS)
    paced = solve(fake_step, 128, 4, 0, Load(MAX, requests=1000), LIMITS, frontend_s=0.02)
    free_makespan, makespan = (1000 * 4 / s.output_tokens_per_s for s in (free, paced))
    assert makespan == pytest.approx(1000 * 0.02 + free_makespan, rel=1e-3)
    assert paced.ttft_s["mean"] == pytest.approx(1000 * 0.02 + free.ttft_s["mean"], rel=1e-3)
    assert paced.tpot_s == pytest.approx(free.tpot_s, rel=1e-3)      # the engine's batch is the burst's
    assert "HTTP server" in paced.note


def test_the_server_shares_its_time_among_the_requests_it_holds():
    assert server_entries([0.0] * 4, 0.01) == pytest.approx([0.04] * 4)       # a burst: together, at the end
    # an idle server hands each request on after its own intake
    assert server_entries([0.0, 1.0, 2.0], 0.01) == pytest.approx([0.01, 1.01, 2.01])
    # two overlap: the first has 5 ms done when the second comes, then both go at half speed
    assert server_entries([0.0, 0.005], 0.01) == pytest.approx([0.015, 0.02])
    assert server_entries([0.005, 0.0], 0.01) == pytest.approx([0.02, 0.015])     # by arrival, not by list order
    assert server_entries([0.0, 0.0], 0.0) == [0.0, 0.0]


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
    cost.overheads = replace(cost.overheads, frontend_ms=4.0, chat_template_ms=6.0)
    assert cost.intake_s() == pytest.approx(1e-2) and cost.intake_s(chat=False) == pytest.approx(4e-3)
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
    intake = StepCost(resolve_model("llama-3.2-1b"), load_profile("h100"), TraceOptions(), "engine", 1).intake_s()
    assert intake > 0 and ttft[0] - ttft[1] >= 0.9 * intake * 1e3


def test_a_poisson_stream_spends_work_over_one_less_rho_in_the_server():
    """M/G/1 processor sharing: a mean time in the server of work / (1 - rho), drawn through the queue itself;
    its delay's p90 and p99 as the shaped tail gives them (an exponential of the same mean put the p99 30% high
    at rho 0.1)."""
    import random
    import numpy as np
    from serving.load_queue import waits_above
    from serving.server_intake import shared_wait
    from serving.workload import arrival_times
    grid = np.linspace(0.0, 0.5, 50_001)
    for rho in (0.1, 0.2, 0.5, 0.8):
        times = arrival_times(200_000, rho / 0.02, random.Random(1), "poisson")
        delays = np.array(server_entries(times, 0.02)) - np.array(times) - 0.02
        assert 0.02 + delays.mean() == pytest.approx(0.02 / (1 - rho), rel=0.03)
        wait = shared_wait(rho, 0.02)
        assert 0.02 + wait.mean == pytest.approx(0.02 / (1 - rho))
        above = waits_above(grid, [wait])
        for q, within in ((0.9, 0.1), (0.99, 0.05)):
            shaped = grid[np.argmax(above <= 1 - q)]
            assert shaped == pytest.approx(np.quantile(delays, q), rel=within), (rho, q)


def test_p99_ttft_behind_the_server_agrees_with_the_event_simulation():
    """Short requests at half the server's pace: the p99 TTFT is mostly the server's queue, whose tail the steady
    state once left out (it added the mean wait to every percentile)."""
    import random
    from serving.workload import arrival_times
    cost = StepCost(resolve_model("llama-3.2-1b"), load_profile("h100"), TraceOptions(), "engine", 1)
    cost.overheads = replace(cost.overheads, frontend_ms=20.0, chat_template_ms=0.0)
    rate, n, prompt, out = 25.0, 4000, 128, 16
    times = arrival_times(n, rate, random.Random(0), "poisson")
    requests = [SimRequest(i, t, prompt, out) for i, t in enumerate(times)]
    res = simulate(requests, cost, ServerConfig(max_running=256, max_prefill_tokens=8192, prefix_caching=False,
                                               gpu_blocks=200_000))
    ttfts = sorted(r.ttft_s for r in res.records)
    simulated = ttfts[int(0.99 * len(ttfts))]
    state = solve(cost.steady, prompt, out, 0, Load(RATE, rate), LIMITS, cost.overheads.request_ms * 1e-3,
                  frontend_s=0.02)
    # the server's shaped tail is within 2% of its own p99 here (rho 0.5); the engine's queue behind it adds 8%
    assert abs(state.ttft_s["p99"] / simulated - 1) < 0.1, (state.ttft_s, simulated)
    assert abs(state.ttft_s["mean"] / (sum(ttfts) / len(ttfts)) - 1) < 0.05
    assert state.ttft_s["p99"] - state.ttft_s["p50"] > 0.04      # the server's tail, not its mean


def test_a_chat_pays_the_template_where_the_engine_renders_one():
    """vLLM parses the model's Jinja chat template on every chat request; gpt-oss's chats it renders with harmony,
    and a completion has no template to render."""
    def intake(model: str, chat: bool) -> float:
        cost = StepCost(resolve_model(model), load_profile("h100"), TraceOptions(), "engine", 1, "vllm")
        cost.overheads = replace(cost.overheads, frontend_ms=2.0, chat_template_ms=10.0)
        return cost.intake_s(chat)
    assert intake("qwen3-8b", True) == pytest.approx(0.012)
    assert intake("qwen3-8b", False) == pytest.approx(0.002)
    assert intake("gpt-oss-20b", True) == pytest.approx(0.002)


def test_a_rows_client_decides_chat_or_completions():
    from serving.published_rows import _chat_requests
    assert _chat_requests({"engine_flags": "vllm serve Qwen/Qwen3-14B", "notes": "vllm bench serve default rate"})
    assert _chat_requests({"notes": "vllm bench serve --endpoint-type openai-chat --dataset-name sharegpt"})
    assert not _chat_requests({"engine_flags": "vllm serve m; vllm bench serve --max-concurrency 4"})


def test_the_endpoint_option_reaches_the_server(capsys):
    import json
    from cli.inference.serving_sim import main
    argv = ["qwen3-8b", "--device", "h100", "--lengths-file", "sharegpt-vllm-bench", "--num-requests", "200", "--json"]
    assert main(argv) == 0
    chat = json.loads(capsys.readouterr().out)
    assert main(argv + ["--endpoint", "completions"]) == 0
    plain = json.loads(capsys.readouterr().out)
    ttft = [list(r["runs"].values())[0]["ttft_ms"]["mean"] for r in (chat, plain)]
    assert chat["endpoint"] == "chat" and plain["endpoint"] == "completions"
    # 200 chats pay the template's parse, all of them before any enters the engine
    template_ms = StepCost(resolve_model("qwen3-8b"), load_profile("h100"), TraceOptions(), "engine", 1,
                           "vllm").overheads.chat_template_ms
    assert template_ms > 0 and ttft[0] - ttft[1] == pytest.approx(200 * template_ms, rel=0.1)
