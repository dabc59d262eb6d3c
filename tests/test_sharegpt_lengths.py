"""ShareGPT bursts as `vllm bench serve --dataset-name sharegpt` sends them: the bundled per-request set, its
sampling rules (bench/sharegpt_lengths.py), a burst that ends with its longest outputs, and SGLang's prefill steps
that its decodes wait through (issue 19, item 2)."""
import importlib.util
import json
from pathlib import Path

import pytest

from serving.lengths import bundled, read_lengths
from serving.published import Predictor, map_row

ROOT = Path(__file__).resolve().parents[1]
ROW = {"id": "test-sharegpt", "source_kind": "test", "model": "Qwen/Qwen3-8B", "gpu": "H100-SXM-80GB",
       "engine": "SGLang", "engine_version": "v0.5.3", "precision": "bf16", "tp": 1, "isl": 217.4, "osl": 201.4,
       "mode": "online_request_rate", "num_requests": 1000, "output_tok_s": 1000.0,
       "dataset": "ShareGPT (ShareGPT_V3_unfiltered_cleaned_split.json, vllm bench serve --num-prompts 1000)",
       "engine_flags": "python3 -m sglang.launch_server --model-path Qwen/Qwen3-8B"}


def _script():
    spec = importlib.util.spec_from_file_location("sharegpt_lengths", ROOT / "bench" / "sharegpt_lengths.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_bundled_set_is_every_sampled_request():
    """15,460 requests, not a quantile summary: a burst of 1000 draws real requests, its longest outputs included;
    its means are those gpustack's Qwen3 runs measured (217.4 prompt, 201.4 generated tokens a request)."""
    s = read_lengths("sharegpt-vllm-bench")
    assert s is bundled("sharegpt-vllm-bench") and not s.summarised and s.requests == 15460
    assert s.mean_input == pytest.approx(219.6, abs=0.1) and s.mean_output == pytest.approx(202.9, abs=0.1)
    assert s.longest("output") == 1856 and max(i for i, _ in s.pairs) <= 1024
    assert all(i >= 4 and o >= 4 and i + o <= 2048 for i, o in s.pairs)
    # a skewed set: the median output is two thirds of the mean, and a running batch leans to the long ones
    assert sorted(s.outputs())[s.requests // 2] == 135 and s.residence_mean(lambda i, o: o) > 2 * s.mean_output


def test_a_run_scales_the_set_to_its_own_means():
    s = bundled("sharegpt-vllm-bench").scaled(180.0, 240.0)
    assert s.mean_output == pytest.approx(180.0, rel=0.01) and s.mean_input == pytest.approx(240.0, rel=0.01)
    assert "outputs x0.887, prompts x1.09" in s.source
    assert bundled("sharegpt-vllm-bench").scaled(202.9).mean_input == pytest.approx(219.6, abs=0.1)


def test_a_sharegpt_burst_ends_with_its_longest_outputs():
    """The same 1000-request burst priced with the set and at its mean lengths: the set's run ends with its
    longest outputs decoding nearly alone, so its tokens/s is well below the mean lengths' (whose requests all
    finish together)."""
    run, why = map_row(ROW)
    assert why is None and run.lengths == "sharegpt-vllm-bench"
    fixed, _ = map_row({**ROW, "dataset": "random"})
    assert fixed.lengths is None
    predictor = Predictor()
    spread, state = predictor.predict(run)
    mean, _ = predictor.predict(fixed)
    assert spread["output_tok_s"] < 0.8 * mean["output_tok_s"]
    assert "sharegpt-vllm-bench" in state.lengths and "outputs x0.991, prompts x0.988" in state.lengths
    # the same requests' mean latency barely moves: what the spread costs is the run's end, not its steps
    assert spread["ttft_ms"] == pytest.approx(mean["ttft_ms"], rel=0.5)


def test_the_sampler_keeps_vllms_rules(tmp_path):
    """Conversations of two turns or more, shuffled with seed 0; prompt and output of 4 tokens or more, a prompt
    of at most 1024 and both at most 2048; a file cut short is read to its last whole conversation."""
    words = lambda n: " ".join(["w"] * n)    # noqa: E731  one token a word with the counter below
    entries = [{"conversations": [{"value": words(p)}, {"value": words(o)}]}
               for p, o in [(10, 20), (3, 20), (10, 3), (1025, 10), (1000, 1049), (1000, 1048)]]
    entries.append({"conversations": [{"value": words(50)}]})
    text = json.dumps(entries)
    path = tmp_path / "cut.json"
    path.write_text(text[:-40])      # the last conversation is cut off
    script = _script()
    assert len(script.conversations(str(path))) == 6
    pairs = script.sample(script.conversations(str(path)), lambda s: len(s.split()))
    assert sorted(pairs) == [(10, 20), (1000, 1048)]


def test_sglang_decodes_wait_through_a_prefill_step():
    """Two prompts of 100 tokens at once, a budget of 150 tokens a step, 10 ms a step: the first prompt's first
    token comes after step 1, the second's prompt ends in step 2. Mixed steps (vLLM) decode the first request in
    step 2; SGLang runs step 2 as prefill alone, so the first request's four decodes take steps 3-6."""
    from serving.step_walk import walk
    step = lambda decoding, prefill: 0.010    # noqa: E731
    mixed = walk(step, [0.0, 0.0], [(100, 5), (100, 5)], admit=8, budget=150, chunked=True)
    apart = walk(step, [0.0, 0.0], [(100, 5), (100, 5)], admit=8, budget=150, chunked=True, prefill_apart=True)
    assert mixed[0] == pytest.approx([0.010, 0.020]) and apart[0] == pytest.approx([0.010, 0.020])
    assert mixed[1] == pytest.approx([0.010, 0.010]) and mixed[2] == pytest.approx(0.060)
    assert sorted(apart[1]) == pytest.approx([0.010, 0.0125]) and apart[2] == pytest.approx(0.060)


def test_sglang_is_priced_with_prefill_apart_unless_it_mixes_chunks():
    sglang, _ = map_row(ROW)
    mixed, _ = map_row({**ROW, "engine_flags": ROW["engine_flags"] + " --enable-mixed-chunk"})
    vllm, _ = map_row({**ROW, "engine": "vLLM", "engine_version": "v0.11.0",
                       "engine_flags": "vllm serve Qwen/Qwen3-8B"})
    predictor = Predictor()
    assert predictor.limits(sglang, predictor.cost(sglang)).prefill_apart
    assert not predictor.limits(mixed, predictor.cost(mixed)).prefill_apart
    assert not predictor.limits(vllm, predictor.cost(vllm)).prefill_apart
    # a burst's decodes wait through the prefill steps: a longer TPOT than the same engine mixing them
    assert predictor.predict(sglang)[0]["tpot_ms"] > 1.1 * predictor.predict(mixed)[0]["tpot_ms"]


def test_serving_sim_says_its_steps_mix_what_sglang_runs_apart(capsys):
    from cli.inference.serving_sim import main as sim_main
    for engine, expected in (("sglang", True), ("vllm", False)):
        sim_main(["qwen3-8b", "--device", "h100", "--engine", engine, "--workload", "random", "--num-requests", "20",
                  "--json"])
        out = json.loads(capsys.readouterr().out)
        assert bool(out["scheduling"]) is expected
        if expected:
            assert "the simulator mixes them in every step" in out["scheduling"]
