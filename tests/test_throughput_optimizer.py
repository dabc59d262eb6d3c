"""RFC section 6 for throughput_optimizer, plus a hand-computed case of the mixed-mode formulas."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from cli.inference.config import InputError
from cli.inference.shapes import ServingShapes
from cli.inference.throughput_optimizer import Evaluator, Limits, batch_grid, main, search_layout
from cost.profile import load_profile
from tracer import TraceOptions, resolve_model

ROOT = Path(__file__).resolve().parents[1]


def test_effective_input_length():
    s = ServingShapes(200, 100, 0.5)
    assert (s.cached_prefix_tokens, s.effective_input_length) == (100, 100)
    assert ServingShapes(200, 100).effective_input_length == 200
    assert ServingShapes(7, 1, 0.99).effective_input_length == 1


def test_prefill_paths_use_effective_length_decode_keeps_original():
    s = ServingShapes(200, 100, 0.5)
    (prefill,) = s.prefill_requests(4)
    assert (prefill.num_queries, prefill.query_length, prefill.context_length) == (4, 100, 100)
    decode = s.decode_request(8)
    assert decode.decode and decode.context_length == 200 + 50
    assert ServingShapes(200, 100, 0.0).decode_request(8) == decode


def test_max_prefill_tokens_and_wave_capacity_use_effective_length():
    assert ServingShapes(200, 10, 0.0, max_prefill_tokens=1000).prefill_batch_size == 5
    assert ServingShapes(200, 10, 0.5, max_prefill_tokens=1000).prefill_batch_size == 10
    # 3000 > 2048 is chunked without the cache; the effective 1500 fits the budget with it
    assert ServingShapes(3000, 10, 0.0, max_prefill_tokens=2048).chunked
    assert not ServingShapes(3000, 10, 0.5, max_prefill_tokens=2048).chunked
    chunks = ServingShapes(5000, 10, 0.2, max_prefill_tokens=2048).prefill_requests(1)
    assert [(r.query_length, r.context_length) for r in chunks] == [(2048, 1000), (1952, 3048)]


def make_evaluator(rate, limits=Limits(), num_devices=2, max_prefill_tokens=1000):
    shapes = ServingShapes(200, 100, rate, max_prefill_tokens)
    return Evaluator(resolve_model("llama-3.2-1b"), load_profile("h100"), shapes, TraceOptions(), "engine",
                     limits, num_devices)


class FakeLatency:
    """Deterministic step times: prefill 1 us per token, decode 10 ms + 0.1 ms per sequence."""

    def __init__(self):
        self.seen = []

    def __call__(self, request, tp, ep):
        self.seen.append(request)
        if request.decode:
            return 0.010 + 0.0001 * request.num_queries
        return 1e-6 * request.num_queries * request.query_length


def test_mixed_mode_formulas_by_hand():
    ev = make_evaluator(0.5)
    ev.latency_s = FakeLatency()
    c = ev.mixed(tp=1, ep=1, batch=32)
    # wave = min(1000 // 100, 32) = 10 requests of 100 tokens: 1 ms; decode step at batch 32: 13.2 ms
    wave_s, step_s = 10 * 100 * 1e-6, 0.010 + 0.0032
    waves = math.ceil(32 / 10)
    cycle_s = 100 * step_s + waves * wave_s
    assert c.prefill_batch_size == 10
    assert c.ttft_ms == pytest.approx((waves + 1) / 2 * (wave_s + step_s) * 1e3)
    assert c.tpot_ms == pytest.approx(cycle_s / 100 * 1e3)
    assert c.dp_size == 2
    assert c.throughput_tokens_per_s == pytest.approx(2 * 32 * 100 / cycle_s)
    assert c.throughput_tokens_per_s_per_device == pytest.approx(c.throughput_tokens_per_s / 2)
    prefill = [r for r in ev.latency_s.seen if not r.decode]
    assert {(r.query_length, r.context_length) for r in prefill} == {(100, 100)}


def test_mixed_ttft_falls_with_hit_rate():
    cold, warm = make_evaluator(0.0), make_evaluator(0.5)
    assert warm.mixed(1, 1, 16).ttft_ms < cold.mixed(1, 1, 16).ttft_ms


def test_disagg_prefill_uses_effective_length_and_decode_ignores_the_cache():
    cold, warm = make_evaluator(0.0), make_evaluator(0.5)
    for ev in (cold, warm):
        ev.latency_s = FakeLatency()
    a, b = cold.disagg(1, 1, 64), warm.disagg(1, 1, 64)
    assert b.tpot_ms == a.tpot_ms
    # a wave holds twice the requests at rate 0.5: fewer prefill instances per decode instance are needed
    assert b.prefill_batch_size == 2 * a.prefill_batch_size
    assert b.prefill_to_decode_ratio == pytest.approx(a.prefill_to_decode_ratio / 2)
    assert {(r.query_length, r.context_length) for r in warm.latency_s.seen if not r.decode} == {(100, 100)}
    assert {r.context_length for r in warm.latency_s.seen if r.decode} == {250}
    assert a.prefill_instances + a.decode_instances == 2
    # real costs too: decode TPOT identical at rate 0 and 0.5
    assert make_evaluator(0.0).disagg(1, 1, 64).tpot_ms == make_evaluator(0.5).disagg(1, 1, 64).tpot_ms


def test_search_finds_largest_feasible_batch():
    grid = batch_grid(1, 1024)
    assert grid[:8] == [1, 2, 3, 4, 6, 8, 12, 16] and grid[-1] == 1024
    ev = make_evaluator(0.0, Limits(tpot_ms=15.0))
    ev.latency_s = FakeLatency()
    found = search_layout(lambda b: ev.mixed(1, 1, b), grid)
    best = max((c for c in found if c.meets_limits), key=lambda c: c.batch_size)
    bigger = [g for g in grid if g > best.batch_size]
    assert not ev.mixed(1, 1, bigger[0]).meets_limits
    assert len(found) < len(grid) / 2


def run_json(capsys, *args):
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_json(capsys):
    out = run_json(capsys, "llama-3.2-1b", "--device", "h100", "--num-devices", "2", "--input-length", "200",
                   "--output-length", "64", "--prefix-cache-hit-rate", "0.5", "--mode", "both", "--batch-range", "1",
                   "64")
    assert (out["effective_input_length"], out["cached_prefix_tokens"], out["mode"]) == (100, 100, "both")
    for key in ("tp_size", "dp_size", "batch_size", "prefill_batch_size", "ttft_ms", "tpot_ms",
                "throughput_tokens_per_s", "throughput_tokens_per_s_per_device", "memory_gb", "meets_limits"):
        assert key in out["best"]
        assert all(key in c for c in out["candidates"])
    assert out["best"]["throughput_tokens_per_s"] == max(c["throughput_tokens_per_s"] for c in out["candidates"]
                                                         if c["meets_limits"])


def test_no_feasible_layout_says_why(capsys):
    out = run_json(capsys, "llama-3.1-405b", "--device", "l4", "--num-devices", "1", "--input-length", "1024",
                   "--output-length", "128")
    assert out["best"] == {} and "memory" in out["why_no_feasible_layout"]
    out = run_json(capsys, "llama-3.2-1b", "--device", "h100", "--num-devices", "1", "--input-length", "1024",
                   "--output-length", "128", "--tpot-limit", "0.001")
    assert out["best"] == {} and "TPOT" in out["why_no_feasible_layout"]


@pytest.mark.parametrize("args", [
    ["--prefix-cache-hit-rate", "1.0"], ["--prefix-cache-hit-rate", "-0.1"], ["--input-length", "0"],
    ["--tp-sizes", "3"], ["--ttft-limit", "-5"], ["--device", "nope"],
])
def test_invalid_input_exits_non_zero(args, capsys):
    base = {"--device": "h100", "--num-devices": "4", "--input-length": "200", "--output-length": "10"}
    for i in range(0, len(args), 2):
        base[args[i]] = args[i + 1]
    argv = ["llama-3.2-1b"] + [x for kv in base.items() for x in kv]
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    assert code == 2
    assert "error" in capsys.readouterr().err


def test_invalid_shapes_raise():
    with pytest.raises(InputError):
        ServingShapes(0, 10)
    with pytest.raises(InputError):
        ServingShapes(10, 10, 1.0)


def test_cli_subprocess():
    r = subprocess.run([sys.executable, "-m", "cli.inference.throughput_optimizer", "llama-3.2-1b", "--device", "h200",
                        "--num-devices", "2", "--input-length", "512", "--output-length", "64", "--ttft-limit", "500",
                        "--batch-range", "1", "128"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "best:" in r.stdout and "tokens/s" in r.stdout


def test_block_granular_hits_and_hit_rate_distribution(tmp_path, capsys):
    assert ServingShapes(1000, 10, 0.5, prefix_cache_block_size=16).cached_prefix_tokens == 496
    assert ServingShapes(1000, 10, 0.5).cached_prefix_tokens == 500
    rates = tmp_path / "rates.txt"
    rates.write_text("0\n0.5\n0.9\n0.9\n")
    base = ["llama-3.2-1b", "--device", "h100", "--num-devices", "1", "--input-length", "1000", "--output-length",
            "64", "--batch-range", "8", "8"]
    dist = run_json(capsys, *base, "--prefix-cache-hit-rate-distribution", str(rates))
    assert dist["prefix_cache_hit_rate"] == pytest.approx(0.575)
    assert [d["weight"] for d in dist["hit_rate_distribution"]] == [0.25, 0.25, 0.5]
    cold = run_json(capsys, *base)
    warm = run_json(capsys, *base, "--prefix-cache-hit-rate", "0.9")
    assert warm["best"]["ttft_ms"] < dist["best"]["ttft_ms"] < cold["best"]["ttft_ms"]
    rates.write_text("0.5\n1.2\n")
    assert main([*base, "--prefix-cache-hit-rate-distribution", str(rates)]) == 2
