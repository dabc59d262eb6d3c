"""The steady-state serving model, the layout search and its agreement with the event simulator."""
from dataclasses import replace
import json
import math

import pytest

from cli.inference.throughput_optimizer import main
from cost.engines import ServingOverheads
from cost.estimate import Parallelism, estimate
from cost.parallel import LayoutError, nodes_spanned
from cost.profile import load_profile, parse_profile
from serving.layouts import Layout, LayoutSpace, layouts
from serving.search import EngineSettings, LatencyLimits, Searcher, Workload
from serving.steady_state import CONCURRENCY, MAX, RATE, Limits, Load, solve
from serving.verify import simulate_candidate
from tracer import TraceOptions, resolve_model
from tracer.trace import trace
from tracer.work import Request


def fake_step(decoding, prefill_tokens, chunk_tokens, chunk_context, decode_context):
    """10 ms + 0.1 ms per decoding request + 2 us per prompt token."""
    return 0.010 + 1e-4 * decoding + 2e-6 * prefill_tokens


def test_steady_state_is_littles_law_at_its_fixed_point():
    limits = Limits(max_num_seqs=256, max_batched_tokens=2048, kv_tokens=10**7)
    s = solve(fake_step, 500, 101, 0, Load(RATE, 4.0, "constant"), limits)
    assert s.stable
    # n = R (O - 1) s and p = R I s at s = step(n, p)
    n, p = 4.0 * 100 * s.step_s, 4.0 * 500 * s.step_s
    assert s.running == pytest.approx(n, rel=1e-4)
    assert s.step_s == pytest.approx(fake_step(n, p, 500, 0, 0), rel=1e-4)
    assert s.tpot_s == s.step_s and s.output_tokens_per_s == pytest.approx(4.0 * 101)
    # evenly spaced arrivals 250 ms apart never queue nor share a step: TTFT = half a step under way + its
    # own prefill step, alone
    own = fake_step(n, 500, 500, 0, 0)
    assert s.ttft_s["mean"] == pytest.approx(s.step_s / 2 + own, rel=1e-6)
    poisson = solve(fake_step, 500, 101, 0, Load(RATE, 4.0), limits)
    assert poisson.ttft_s["mean"] > s.ttft_s["mean"] and poisson.ttft_s["p99"] > poisson.ttft_s["p50"]


def test_a_lone_user_finds_the_engine_idle():
    """A closed loop of one user sends its next request when the last one ends: no step is under way, so its TTFT is
    its own prefill step (and the request overhead), not half a step more. Two users keep the engine stepping."""
    limits = Limits(max_num_seqs=256, max_batched_tokens=2048, kv_tokens=10**7)
    one = solve(fake_step, 500, 101, 0, Load(CONCURRENCY, 1.0), limits, request_overhead_s=0.005)
    assert one.ttft_s["mean"] == pytest.approx(0.005 + fake_step(one.running, 500, 500, 0, 0), rel=1e-6)
    assert one.ttft_s["p99"] == pytest.approx(one.ttft_s["mean"], rel=1e-6)
    two = solve(fake_step, 500, 101, 0, Load(CONCURRENCY, 2.0), limits, request_overhead_s=0.005)
    assert two.ttft_s["mean"] > one.ttft_s["mean"] + two.step_s / 3


def test_overload_is_refused_or_walked_and_burst_drains():
    limits = Limits(max_num_seqs=32, max_batched_tokens=2048, kv_tokens=10**7)
    over = solve(fake_step, 500, 101, 0, Load(RATE, 1000.0), limits)
    assert not over.stable and "exceeds" in over.note and over.running <= 33
    finite = solve(fake_step, 500, 101, 0, Load(RATE, 1000.0, requests=200), limits)
    assert finite.ttft_s["mean"] > over.step_s * 10        # a queue that grew while requests arrived
    burst = solve(fake_step, 500, 101, 0, Load(MAX, requests=64), limits)
    # 64 requests, 32 at a time, 4 prompts per 2048-token step: the last first token after 16+ steps
    assert burst.ttft_s["p99"] > burst.ttft_s["p50"] > 0
    closed = solve(fake_step, 500, 101, 0, Load(CONCURRENCY, 8), limits)
    assert closed.request_rate == pytest.approx(8 / closed.e2e_s["mean"], rel=0.02)


def searcher(hit_rate=0.0, limits=LatencyLimits(), model="llama-3.2-1b", device="h100", options=TraceOptions()):
    cached = math.floor(1000 * hit_rate)
    return Searcher(resolve_model(model), load_profile(device), options, Workload(1000, 128, cached),
                    EngineSettings(), limits)


def test_prefix_hits_shorten_prefill_not_decode():
    # without the HTTP server's intake, which caps a small model's prefill pool at 1 / frontend_ms either way
    cold, warm = searcher(0.0), searcher(0.5)
    for s in (cold, warm):
        s.settings = replace(s.settings, overheads=replace(s.cost(Layout(1)).overheads, frontend_ms=0.0,
                                                               chat_template_ms=0.0))
        s._costs.clear()
    lay, load = Layout(1), Load(RATE, 20.0)
    a, b = cold.mixed(lay, load), warm.mixed(lay, load)
    assert b.ttft_ms["mean"] < a.ttft_ms["mean"]
    assert b.tpot_ms <= a.tpot_ms
    # decode-only steps are the same step whatever the hit rate (RFC 4.3: decode keeps the original lengths)
    assert cold.decode_capacity(lay) == warm.decode_capacity(lay)
    assert warm.prefill_capacity(lay, None)[0] > 1.5 * cold.prefill_capacity(lay, None)[0]


def test_best_rate_is_the_edge_of_the_limits():
    s = searcher(limits=LatencyLimits(ttft_ms=200, tpot_ms=20))
    best = s.best_rate(Layout(1))
    assert best.meets_limits
    beyond = s.mixed(Layout(1), Load(RATE, best.request_rate * 1.05))
    assert not beyond.meets_limits


@pytest.mark.parametrize("stat", ["mean", "p90"])
def test_probes_answer_the_limits_as_the_full_solve_does(stat):
    """A bisection's probe computes only the limits' statistic; it must meet or miss them exactly as the full
    solve does, with the same numbers, and the search's answer is the full solve at the rate it settled on."""
    s = searcher(limits=LatencyLimits(ttft_ms=200, tpot_ms=20, stat=stat))
    top = s.mixed(Layout(1), Load(RATE, 1e9)).request_rate
    for share in (0.2, 0.6, 0.9, 0.99):
        load = Load(RATE, share * top)
        full, probe = s.mixed(Layout(1), load), s.mixed(Layout(1), load, probe=True)
        assert set(full.ttft_ms) == {"mean", "p50", "p90", "p99"} and set(probe.ttft_ms) == {"mean", stat}
        assert probe.meets_limits == full.meets_limits and probe.why_not == full.why_not
        assert probe.ttft_ms == {k: full.ttft_ms[k] for k in probe.ttft_ms} and probe.tpot_ms == full.tpot_ms
        assert probe.tpot_stats_ms == {k: full.tpot_stats_ms[k] for k in probe.tpot_stats_ms}
    best = s.best_rate(Layout(1))
    again = s.mixed(Layout(1), Load(RATE, best.request_rate))
    assert best.as_json() == again.as_json() and set(best.ttft_ms) == {"mean", "p50", "p90", "p99"}


def test_steady_steps_are_remembered_as_priced(monkeypatch):
    """A search asks StepCost.steady for the same step many times: the remembered value is the priced one, and the
    memory is bounded."""
    import serving.step_cost as step_cost
    s = searcher()
    cost, fresh = s.cost(Layout(1)), searcher().cost(Layout(1))
    monkeypatch.setattr(step_cost, "STEADY_MEMO", 2)
    shapes = [(12.5, 700.0, 1000, 0.0, 1064.0), (3.0, 0.0, 1000, 0.0, 1064.0), (40.25, 1500.0, 1000, 250.0, 1064.0)]
    first = [cost.steady(*shape) for shape in shapes]
    assert len(cost._steady) <= 2
    assert [cost.steady(*shape) for shape in shapes] == first == [fresh._steady_step(*shape, 1, 0.0)
                                                                 for shape in shapes]
    assert first[0] > first[1] > 0
    # new overheads on the same StepCost (a fit tries several): the remembered steps are priced again (0.1 s of
    # host work a step outlasts any of these GPU steps, so it shows even where the engine schedules ahead)
    cost.overheads = fresh.overheads = replace(cost.overheads, step_us=cost.overheads.step_us + 1e5)
    again = cost.steady(*shapes[2])
    assert again == fresh._steady_step(*shapes[2], 1, 0.0) and again > first[2] + 0.05


def test_solve_without_quantiles_keeps_the_means():
    limits = Limits(max_num_seqs=64, max_batched_tokens=2048, kv_tokens=10**6)
    for load in (Load(RATE, 6.0), Load(RATE, 1000.0), Load(CONCURRENCY, 8), Load(MAX)):
        full, means = solve(fake_step, 500, 101, 0, load, limits), solve(fake_step, 500, 101, 0, load, limits,
                                                                          quantiles=())
        assert full.ttft_s["p99"] > full.ttft_s["p50"] and set(means.ttft_s) == {"mean"}
        assert means.ttft_s["mean"] == full.ttft_s["mean"] and means.tpot_s == full.tpot_s
        assert means.request_rate == full.request_rate and means.running == full.running


def test_layouts_cover_pp_ep_and_attention_dp():
    dense = layouts(8, 32, 0, LayoutSpace(pp_sizes=(1, 2)))
    assert Layout(8, 1, 1) in dense and Layout(4, 2, 1) in dense and Layout(1, 1, 8) in dense
    assert all(lay.ep == 1 and not lay.attention_dp for lay in dense)
    moe = layouts(8, 64, 256, LayoutSpace(ep_sizes=(1, 4, 8)))
    assert any(lay.tp == 8 and lay.ep == 4 for lay in moe)               # EP independent of TP
    adp = [lay for lay in moe if lay.attention_dp]
    assert Layout(1, 1, 8, 8, True) in adp and all(lay.ep == lay.tp * lay.dp for lay in adp)
    with pytest.raises(ValueError):
        Parallelism(1, 4, attention_dp=8)


def test_attention_dp_moe_takes_every_rank_tokens():
    hw = load_profile("h200")
    t = trace(resolve_model("qwen3-30b-a3b"), Request(16, 1, 1024, decode=True), TraceOptions())
    alone = estimate(t, hw, par=Parallelism(1, 1))
    adp = estimate(t, hw, par=Parallelism(1, 8, "dispatch", attention_dp=8))
    moe = [k for k in adp.kernels if k.kernel.moe is not None][0].kernel.moe
    # 8 ranks x 16 tokens x top-8 routed pairs spread over EP 8: 128 pairs per rank
    assert moe.tokens == 16 * 8 and moe.ep == 8
    assert adp.breakdown_s["communication"] > 0 and alone.breakdown_s["communication"] == 0


def test_cross_node_collectives_use_the_scale_out_network():
    hw = load_profile("h100")
    t = trace(resolve_model("llama-3.1-8b"), Request(1, 1024, 0), TraceOptions())
    one_node = estimate(t, hw, par=Parallelism(8)).breakdown_s["communication"]
    two_nodes = estimate(t, hw, par=Parallelism(16)).breakdown_s["communication"]
    assert two_nodes > 1.3 * one_node     # each GPU ships its 1/8 shard over its own 400 Gb/s NIC
    assert nodes_spanned(16, hw) == 2
    data = json.loads(open(hw.path).read())
    del data["scale_out"]
    bare = parse_profile(data, "h100", "no-scale-out")
    with pytest.raises(LayoutError):
        nodes_spanned(16, bare)


@pytest.mark.slow
@pytest.mark.parametrize("mix", [False, True])
def test_highest_rate_within_p99_limits_agrees_with_the_simulator(mix):
    """The highest rate within p99 TTFT and TPOT limits, from the steady state and from event simulations of the
    same setup (bisection over converged runs). Fixed lengths near compute saturation (TPOT binds); the MLPerf
    Llama-2-70B length mix with 64 slots, where the admission queue sets the p99 TTFT."""
    from serving.lengths import read_lengths
    from serving.verify import simulated_best_rate
    lengths = read_lengths("mlperf-llama2-70b") if mix else None
    w = Workload(round(lengths.mean_input), round(lengths.mean_output), lengths=lengths) if mix else \
        Workload(1000, 128)
    # overheads pinned (the model and the simulator share them; the bundled fit may move): light per-request cost,
    # so the 64 slots, not the steps, bind and the admission queue shows in the p99 TTFT
    pinned = ServingOverheads(step_us=150.0, seq_us=0.25, gpu_sync_us=400.0, request_ms=5.0, reserve_gb=0.5)
    s = Searcher(resolve_model("llama-3.2-1b"), load_profile("h100"), TraceOptions(), w,
                 EngineSettings(max_num_seqs=64 if mix else None, overheads=pinned), LatencyLimits(100, 15, "p99"))
    best = s.best_rate(Layout(1))
    assert best.meets_limits and best.tpot_stats_ms["p99"] > best.tpot_stats_ms["p50"]
    rate, sim = simulated_best_rate(s, Layout(1), best.request_rate)
    assert rate == pytest.approx(best.request_rate, rel=0.10)
    if mix:    # the queue for a slot: a p99 TTFT far above the median, in both
        assert best.ttft_ms["p99"] > 5 * best.ttft_ms["p50"] and sim["ttft_ms"]["p99"] > 5 * sim["ttft_ms"]["p50"]


def test_cli_searches_moe_layouts_and_verifies(capsys):
    assert main(["qwen3-30b-a3b", "--device", "h200", "--num-devices", "2", "--input-length", "256",
                 "--output-length", "32", "--request-rate", "2", "--ep-sizes", "1,2", "--pp-sizes", "1,2",
                 "--verify", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    shapes = {(c["tp_size"], c["pp_size"], c["ep_size"], c["attention_dp"]) for c in out["candidates"]}
    assert any(adp for *_, adp in shapes) and any(pp == 2 for _, pp, _, _ in shapes)
    assert "verified" in out["candidates"][0] or out["candidates"][0]["mode"] == "disagg"


@pytest.mark.parametrize("dp", [1, 2])
def test_ttft_counts_the_long_prefill_steps_requests_arrive_in(dp):
    """Long prompts and a light decode load: steps with a prefill are many times longer than the others, and a
    Poisson arrival lands in one more often than their share of steps (the mean of the step under way is
    E[S^2] / E[S]); round robin over DP replicas spreads arrivals and weakens that."""
    s = Searcher(resolve_model("llama-3.2-1b"), load_profile("h100"), TraceOptions(), Workload(8000, 64),
                 EngineSettings(), LatencyLimits())
    layout = Layout(1, dp=dp)
    top = s.mixed(layout, Load(RATE, 1e9)).request_rate
    c = s.mixed(layout, Load(RATE, 0.5 * top))
    sim = simulate_candidate(s, c, Load(RATE, 0.5 * top))
    assert sim["ttft_ms"]["mean"] == pytest.approx(c.ttft_ms["mean"], rel=0.15)
    assert sim["output_tokens_per_s"] == pytest.approx(c.output_tokens_per_s, rel=0.15)


def test_prompts_beyond_the_budget_fill_later_steps():
    """Prompts about as long as the token budget: one per step, so the replica saturates at one prompt per
    prefill step, and what binds is the prefill budget."""
    prefill_step = fake_step(1, 8000, 8000, 0, 0)
    top = solve(fake_step, 8000, 2, 0, Load(RATE, 1e9), Limits(1024, 8192, 10**7))
    assert 0.95 / prefill_step < top.request_rate <= 1.0 / prefill_step
    assert top.limited_by == "prefill budget"
    short = solve(fake_step, 1000, 2, 0, Load(RATE, 1e9), Limits(1024, 8192, 10**7))
    assert 0.95 * 8 / fake_step(1, 8000, 1000, 0, 0) < short.request_rate


def test_a_mean_near_capacity_is_flagged_as_a_range():
    """Near saturation the mean TPOT at a rate moves by far more than the rate: within 5% of the highest rate the
    layout serves, the candidate says how wide; at a third of it, it says nothing."""
    from serving.search import RATE
    from serving.steady_state import Load
    s = Searcher(resolve_model("llama-3.2-1b"), load_profile("h100"), TraceOptions(), Workload(1000, 128),
                 EngineSettings(), LatencyLimits())
    top = s.best_rate(Layout(1)).request_rate
    near = s.rate_sensitivity(Layout(1), Load(RATE, 0.97 * top))
    assert near is not None and near.startswith("near capacity")
    assert s.rate_sensitivity(Layout(1), Load(RATE, top / 3)) is None
    assert s.rate_sensitivity(Layout(1), Load(RATE, 2 * top)) is None      # overloaded: the warning's job


def test_a_percentile_limit_is_simulated_long_enough_to_rest_on_its_tail():
    """A p99 taken over a 400-request run stands on its third-highest TTFT: --verify runs a percentile limit for at
    least 50 requests beyond it in the measured 60% of the run."""
    from serving.verify import tail_requests
    assert (tail_requests("p99"), tail_requests("p90"), tail_requests("mean")) == (8334, 834, 0)
    s = Searcher(resolve_model("llama-3.2-1b"), load_profile("h100"), TraceOptions(), Workload(128, 16),
                 EngineSettings(), LatencyLimits(200, 15, "p99"))
    load = Load(RATE, 5.0)
    sim = simulate_candidate(s, s.mixed(Layout(1), load), load)
    assert sim["requests"] >= 8334
