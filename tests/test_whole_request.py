"""text_generate --output-length: one static batch walked step by step (serving/batch_latency.py)."""
import json
import statistics

import pytest

from cli.inference.text_generate import main
from cost.profile import load_profile
from serving.batch_latency import static_batch
from serving.simulator import ServerConfig, simulate
from serving.step_cost import StepCost
from serving.workload import SimRequest
from tracer.model_source import resolve_model
from tracer.work import TraceOptions


@pytest.fixture(scope="module")
def cost():
    return StepCost(resolve_model("llama-3.2-1b"), load_profile("h100"), TraceOptions(), "engine", 1, "vllm")


@pytest.mark.parametrize("batch,prompt,output,budget,running", [
    (8, 2048, 64, 8192, 256),     # several prompts per step, then decodes beside the last chunks
    (3, 5000, 20, 2048, 256),     # prompts longer than the budget: chunked
    (12, 300, 40, 8192, 4),       # more requests than slots: the rest wait for one
    (1, 128, 1, 8192, 256),       # one output token: TTFT is the whole request
])
def test_walk_matches_the_event_simulation(cost, batch, prompt, output, budget, running):
    walk = static_batch(cost, batch, prompt, output, budget, running)
    sim = simulate([SimRequest(i, 0.0, prompt, output) for i in range(batch)], cost,
                   ServerConfig(gpu_blocks=10**6, max_prefill_tokens=budget, max_running=running,
                                prefix_caching=False, api_server=False))   # benchmark_latency: no HTTP server
    assert len(sim.records) == batch
    assert walk.latency_s == pytest.approx(max(r.finish_s for r in sim.records), rel=0.02)
    assert walk.stats(walk.ttft_s)["mean"] == pytest.approx(statistics.fmean(r.ttft_s for r in sim.records), rel=0.02)
    if output > 1:
        assert walk.stats(walk.tpot_s)["mean"] == pytest.approx(
            statistics.fmean(r.tpot_s for r in sim.records), rel=0.02)


def test_walk_schedules_within_the_budget(cost):
    walk = static_batch(cost, 5, 3000, 10, 4096, 256)
    assert all(sum(t for t, _ in s.chunks) + s.decode_batch <= 4096 for s in walk.steps)
    assert sum(t for s in walk.steps for t, _ in s.chunks) == 5 * 3000
    assert sum(s.decode_batch for s in walk.steps) == 5 * (10 - 1)   # the first token comes with the prefill
    assert max(walk.ttft_s) > min(walk.ttft_s)                        # later prompts wait for earlier chunks


def test_without_chunked_prefill_steps_do_not_mix(cost):
    walk = static_batch(cost, 6, 1000, 8, 2048, 256, chunked=False)
    assert all(not (s.chunks and s.decode_batch) for s in walk.steps)
    assert all(t == 1000 for s in walk.steps for t, _ in s.chunks)    # whole prompts only
    assert walk.prefill_steps == 3


def test_decode_context_grows(cost):
    walk = static_batch(cost, 2, 100, 50, 8192, 256)
    contexts = [s.decode_context for s in walk.steps if s.decode_batch]
    assert contexts == list(range(100, 149))
    assert walk.steps[-1].seconds > walk.steps[1].seconds


def test_cli_whole_request_is_the_sum_of_its_steps(capsys):
    assert main(["llama-3.2-1b", "--device", "h100", "-b", "4", "-q", "1024", "--output-length", "32",
                 "--max-prefill-tokens", "2048", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["phase"] == "whole_request"
    assert out["steps_ms"] == pytest.approx(sum(s["ms"] for s in out["steps"]))
    assert out["e2e_latency_ms"] == pytest.approx(out["steps_ms"] + out["outside_steps_ms"])
    # 1024 + 1024; two decodes + 1024 + 1022; two decodes + the last 2 (decode tokens share the budget)
    assert out["prefill_steps"] == 3 and out["decode_steps"] == 31
    assert out["output_tokens_per_s"] == pytest.approx(4 * 32 / out["e2e_latency_ms"] * 1e3)
    assert out["ttft_ms"]["p99"] >= out["ttft_ms"]["p50"] and out["tpot_ms"]["mean"] > 0
    assert out["scheduler"] == {"max_batched_tokens": 2048, "max_num_seqs": 1024, "chunked_prefill": True}


def test_cli_text_output(capsys):
    assert main(["llama-3.2-1b", "--device", "h100", "-b", "2", "-q", "256", "-n", "16"]) == 0
    text = capsys.readouterr().out
    assert "end-to-end latency" in text and "TPOT" in text and "one batch as `vllm bench latency`" in text


@pytest.mark.parametrize("extra", [["--decode"], ["-c", "100"], ["--prefix-cache-hit-rate", "0.5"]])
def test_single_step_flags_are_refused_with_output_length(capsys, extra):
    assert main(["llama-3.2-1b", "--device", "h100", "-q", "16", "-n", "8", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --output-length") and "Traceback" not in err


def test_scheduler_flags_need_output_length(capsys):
    assert main(["llama-3.2-1b", "--device", "h100", "--max-running", "8"]) == 2


def test_decode_without_context_warns(capsys):
    assert main(["llama-3.2-1b", "--device", "h100", "--decode", "--json"]) == 0
    assert "--decode without --context-length" in capsys.readouterr().err
    assert main(["llama-3.2-1b", "--device", "h100", "--decode", "-c", "0", "--json"]) == 0
    assert "--decode without" not in capsys.readouterr().err


def test_prefill_beyond_the_engine_budget_is_noted(capsys):
    assert main(["llama-3.2-1b", "--device", "h100", "-b", "32", "-q", "2048", "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any("65,536 tokens" in n and "8 steps" in n for n in notes)


def test_cli_without_chunked_prefill(capsys):
    assert main(["llama-3.2-1b", "--device", "h100", "-b", "6", "-q", "1000", "-n", "8", "--no-chunked-prefill",
                 "--max-prefill-tokens", "2048", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scheduler"]["chunked_prefill"] is False
    assert all(not (s["prefill_chunks"] and s["decode_batch"]) for s in out["steps"])
    assert out["prefill_steps"] == 3
    assert main(["llama-3.2-1b", "--device", "h100", "--no-chunked-prefill"]) == 2
