"""Length distributions, the engine at high load, finite bursts of mixed requests (issue 19, item 2)."""
import json
import random

import pytest

from cli.inference.serving_sim import main as sim_main
from cli.inference.throughput_optimizer import main as opt_main
from serving.lengths import LengthsError, bundled_sets, read_lengths
from serving.load_queue import batch_law, peakedness
from serving.steady_state import MAX, RATE, Limits, Load, solve


def fake_step(decoding, prefill_tokens, chunk_tokens, chunk_context, decode_context):
    """10 ms + 0.1 ms per decoding request + 2 us per prompt token."""
    return 0.010 + 1e-4 * decoding + 2e-6 * prefill_tokens


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_reader_takes_csv_and_jsonl_and_refuses_bad_rows(tmp_path):
    csv = read_lengths(write(tmp_path, "a.csv", "isl,osl\n100,10\n300,30\n"))
    assert (csv.mean_input, csv.mean_output, csv.requests) == (200, 20, 2)
    jsonl = read_lengths(write(tmp_path, "b.jsonl", '{"prompt_tokens": 5, "completion_tokens": 7}\n\n'
                                                    '{"prompt_tokens": 15, "completion_tokens": 9}\n'))
    assert jsonl.pairs == ((5, 7), (15, 9)) and "2 requests, input mean 10" in jsonl.describe()
    for name, text, message in [("c.csv", "a,b\n1,2\n", "no input length column"),
                                ("d.csv", "input_length,output_length\n1,x\n", "d.csv:2"),
                                ("e.jsonl", '{"isl": 3, "osl": 0}\n', "e.jsonl:1"),
                                ("f.jsonl", '{"isl": 3\n', "not JSON"), ("g.csv", "", "empty")]:
        with pytest.raises(LengthsError, match=message):
            read_lengths(write(tmp_path, name, text))


def test_bundled_mlperf_summary_keeps_its_facts():
    """Llama-2-70B's set: 24576 requests, input median 152, mean 222, max 1021 (issue 19)."""
    assert {"mlperf-llama2-70b", "mlperf-mixtral-8x7b"} <= set(bundled_sets())
    d = read_lengths("mlperf-llama2-70b")
    assert d.requests == 24576 and round(d.mean_input) == 222 and d.longest("input") == 1021
    assert "input mean 222 p50 152 max 1021" in d.describe()
    # a request counts in the running mix for as long as it decodes: the mix leans to long outputs
    assert d.residence_mean(lambda i, o: o) > 1.3 * d.mean_output


def test_admission_and_prefill_see_the_spread():
    """Same means, different spread: long outputs hold more KV per running request (fewer admitted), and long
    prompts take several chunks (a higher TTFT tail) than the fixed mean lengths."""
    from serving.lengths import LengthDistribution
    mix = LengthDistribution("mix", 4, ((100, 10), (100, 10), (100, 10), (3700, 370)))
    limits = Limits(max_num_seqs=1024, max_batched_tokens=2048, kv_tokens=200_000)
    fixed = solve(fake_step, 1000, 100, 0, Load(MAX), limits)
    mixed = solve(fake_step, 1000, 100, 0, Load(MAX), limits, lengths=mix)
    assert mixed.running < 0.6 * fixed.running and "lengths: mix" in mixed.lengths
    at = 0.3 * fixed.request_rate
    f = solve(fake_step, 1000, 100, 0, Load(RATE, at), limits)
    m = solve(fake_step, 1000, 100, 0, Load(RATE, at), limits, lengths=mix)
    assert m.ttft_s["p99"] > 1.3 * f.ttft_s["p99"]
    assert m.tpot_q_s["p99"] > m.tpot_q_s["p50"]


def test_full_batch_queues_requests_and_stretches_the_p99():
    """Near the rate the full batch carries, arrivals find every slot taken: TTFT's p99 holds a wait for a slot
    (Erlang C), which the mean fixed point does not have."""
    limits = Limits(max_num_seqs=32, max_batched_tokens=4096, kv_tokens=10**7)
    top = solve(fake_step, 200, 101, 0, Load(RATE, 1e9), limits).request_rate
    light = solve(fake_step, 200, 101, 0, Load(RATE, 0.5 * top), limits)
    heavy = solve(fake_step, 200, 101, 0, Load(RATE, 0.95 * top), limits)
    assert light.queue_s < 1e-3 * light.step_s and heavy.queue_s > heavy.step_s
    assert heavy.ttft_s["p99"] > 3 * light.ttft_s["p99"] and heavy.running < 32
    even = solve(fake_step, 200, 101, 0, Load(RATE, 0.95 * top, "constant"), limits)
    assert even.queue_s == 0.0        # fixed lengths, evenly spaced: a steady batch, no queue
    # the law: a mean near the fixed point, more mass at the cap when busier
    law = batch_law(0.95 * top, 32, 102, lambda m: fake_step(m, 0, 1, 0, 0), 1.0)
    assert law.stable and law.queued > 0.1 and peakedness(1.0, 0.0) == 1.0 and peakedness(0.0, 0.0) == 0.0


def test_burst_of_a_mix_ends_with_its_longest_outputs():
    from serving.lengths import LengthDistribution
    limits = Limits(max_num_seqs=64, max_batched_tokens=4096, kv_tokens=10**7)
    short = LengthDistribution("s", 2, ((200, 50), (200, 50)))
    tail = LengthDistribution("t", 2, ((200, 10), (200, 90)))     # same mean output, a long tail
    a = solve(fake_step, 0, 0, 0, Load(MAX, requests=64), limits, lengths=short)
    b = solve(fake_step, 0, 0, 0, Load(MAX, requests=64), limits, lengths=tail)
    assert b.output_tokens_per_s < 0.8 * a.output_tokens_per_s


def test_a_fixed_length_burst_is_walked_wave_by_wave():
    """A burst of fixed lengths is walked at any size a length set is. Beyond six full batches it had taken the
    steady state over the waves, smooth in the burst's size: a run on either side of that line moved by up to 10%,
    and the last, partial wave was never seen. Walked, one request past seven full batches decodes alone."""
    limits = Limits(max_num_seqs=64, max_batched_tokens=4096, kv_tokens=10**7)
    makespan = {}
    for n in (64, 448, 449):
        state = solve(fake_step, 500, 100, 0, Load(MAX, requests=n), limits)
        assert "over the waves" not in state.note
        makespan[n] = n * 100 / state.output_tokens_per_s
    assert makespan[448] == pytest.approx(7 * makespan[64], rel=0.1)
    alone = 100 * fake_step(1, 0, 0, 0, 0)          # 100 tokens at a batch of one
    assert 0.7 * alone < makespan[449] - makespan[448] < 1.1 * alone


def test_a_burst_takes_the_expected_sample_of_its_lengths():
    """A burst of n is priced on n requests at the output quantiles where the order statistics of n random draws
    have their medians: its mean output is the set's (one random draw of 1,000 ShareGPT requests runs 2% long), and
    its longest outputs are those that half of all draws exceed, whatever the seed."""
    d = read_lengths("sharegpt-vllm-bench")
    picked = d.stratified(1000)
    assert len(picked) == 1000 and picked == d.stratified(1000)
    outputs = sorted(o for _, o in picked)
    assert sum(outputs) / 1000 == pytest.approx(d.mean_output, rel=0.01)
    assert sum(i for i, _ in picked) / 1000 == pytest.approx(d.mean_input, rel=0.04)
    everything = d.outputs()
    assert outputs[-1] == everything[int((1000 - 1 / 3) / (1000 + 1 / 3) * len(everything))]
    for k in (1, 2, 5):     # the k-th longest of 60 random draws: as many above the expected sample's as below
        kth = sorted(sorted((o for _, o in random.Random(seed).sample(d.pairs, 1000)), reverse=True)[k - 1]
                     for seed in range(60))
        assert kth[15] <= outputs[-k] <= kth[45]
    assert sorted(d.stratified(d.requests)) == sorted(d.pairs)       # n of n: every request once
    assert sorted(o for _, o in d.stratified(1000, seed=3)) == outputs     # the seed orders, never picks


def test_a_burst_through_an_engine_that_holds_one_request_is_walked():
    # the KV cache holds one 32k-token request at a time: no steady state (no room for n + 1 running), so the
    # burst is walked one request after another instead of priced over a rate of ~0 (issue 19: a 1e21 ms TTFT)
    limits = Limits(max_num_seqs=2048, max_batched_tokens=8192, kv_tokens=50_000)
    state = solve(fake_step, 32_000, 80, 0, Load(MAX, requests=20), limits)
    one = solve(fake_step, 32_000, 80, 0, Load(MAX, requests=1), limits)
    makespan = 20 / state.request_rate
    assert 15 * (1 / one.request_rate) < makespan < 25 * (1 / one.request_rate)
    assert state.ttft_s["mean"] < makespan


def test_clis_take_a_lengths_file_and_a_burst(tmp_path, capsys):
    f = write(tmp_path, "l.csv", "input_length,output_length\n100,20\n400,60\n50,5\n")
    args = ["llama-3.2-1b", "--device", "h100", "--num-devices", "1", "--lengths-file", f, "--num-requests", "30",
            "--json"]
    assert opt_main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["lengths"].startswith(f"lengths: {f}, 3 requests") and out["load"]["requests"] == 30
    assert any(n.startswith("30 requests queued at once") for n in out["best"]["notes"])
    assert opt_main(["llama-3.2-1b", "--device", "h100", "--num-devices", "1", "--input-length", "100",
                     "--output-length", "10", "--tpot-limit", "1", "--limit-stat", "p99"]) == 0
    assert "TPOT p99" in capsys.readouterr().out
    assert opt_main(["llama-3.2-1b", "--device", "h100", "--num-devices", "1", "--lengths-file", f,
                     "--input-length", "5"]) == 2
    assert sim_main(["llama-3.2-1b", "--device", "h100", "--lengths-file", f, "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["num_requests"] == 3 and sim["lengths"].startswith("lengths: ")
    assert sim_main(["llama-3.2-1b", "--device", "h100", "--lengths-file", str(tmp_path / "none.csv")]) == 2
    assert "error:" in capsys.readouterr().err


def test_engines_admit_by_the_output_share_they_hold_and_a_full_cache_serves_nothing():
    from serving.capacity import output_kv_share
    from serving.steady_state import admitted
    grows = Limits(1024, 2048, 100_000, output_kv_share=output_kv_share("vllm"))
    reserves = Limits(1024, 2048, 100_000, output_kv_share=output_kv_share("trtllm"))
    packs = Limits(1024, 2048, 100_000, output_kv_share=output_kv_share("trtllm", "max_utilization"))
    assert admitted(grows, 1000, 1000) == 66 and admitted(reserves, 1000, 1000) == 50
    assert admitted(packs, 1000, 1000) == 66
    with pytest.raises(ValueError, match="not one of vllm's"):
        output_kv_share("vllm", "max_utilization")
    tiny = solve(fake_step, 1000, 1000, 0, Load(RATE, 1.0), Limits(1024, 2048, 1500))
    assert tiny.request_rate == 0 and not tiny.stable and "cannot hold one request" in tiny.note
    d = read_lengths("mlperf-llama2-70b").scaled(291)
    assert d.mean_output == pytest.approx(291, rel=0.01) and d.longest("output") > 1016


@pytest.mark.parametrize("per_request_s", [0.2e-3, 0.3e-3, 0.35e-3])
def test_saturation_of_a_step_linear_in_its_work_is_the_analytic_one(per_request_s):
    """A step of a + b n + c p (n decodes, p prompt tokens) at a rate R holds n = R D s and p = R I s, so the
    full batch (n = admit) completes R = admit / (D a + admit (D b + I c)) requests/s. The mean step there grows
    nearly as fast as the step itself, where the secant search for the step did not settle and its last
    iterate (a small batch, a short step) passed for a stable state 15-31% past saturation."""
    a, c, admit = 0.0157, 0.287e-3, 4096

    def step(decoding, prefill_tokens, chunk_tokens, chunk_context, decode_context):
        return a + per_request_s * decoding + c * prefill_tokens
    state = solve(step, 128, 128, 0, Load(MAX), Limits(max_num_seqs=admit, max_batched_tokens=8192,
                                                           kv_tokens=10_000_000))
    analytic = admit / (127 * a + admit * (127 * per_request_s + 128 * c))
    assert state.request_rate == pytest.approx(analytic, rel=0.01)
    assert state.running > 0.95 * admit
