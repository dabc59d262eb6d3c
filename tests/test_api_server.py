"""The HTTP server's serial intake (cost/engines.py ServingOverheads.frontend_ms): a burst enters the engine at
its pace, a stream faster than it is not served, and the steady state and the event simulation agree."""
from dataclasses import replace

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
