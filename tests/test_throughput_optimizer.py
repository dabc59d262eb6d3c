"""RFC section 6 for throughput_optimizer, plus a hand-computed case of the mixed-mode formulas."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli.inference.config import InputError
from cli.inference.shapes import ServingShapes
from cli.inference.throughput_optimizer import main

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


def run_json(capsys, *args):
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_json(capsys):
    out = run_json(capsys, "llama-3.2-1b", "--device", "h100", "--num-devices", "2", "--input-length", "200",
                   "--output-length", "64", "--prefix-cache-hit-rate", "0.5", "--mode", "both",
                   "--max-prefill-tokens", "1000", "--request-rate", "20")
    assert (out["effective_input_length"], out["cached_prefix_tokens"], out["mode"]) == (100, 100, "both")
    # RFC 4.3: the wave capacity under the token budget, top level and per candidate
    assert out["prefill_batch_size"] == 10
    for key in ("tp_size", "pp_size", "dp_size", "ep_size", "batch_size", "request_rate", "prefill_batch_size",
                "first_wave_requests", "ttft_ms", "tpot_ms", "output_tokens_per_s", "output_tokens_per_s_per_gpu",
                "tokens_per_s_per_user", "memory_gb_per_gpu", "meets_limits"):
        assert key in out["best"]
        assert all(key in c for c in out["candidates"])
    assert all(c["prefill_batch_size"] == 10 and 1 <= c["first_wave_requests"] <= 10 for c in out["candidates"])
    assert {c["mode"] for c in out["candidates"]} == {"mixed", "disagg"}
    assert out["best"]["output_tokens_per_s"] == max(c["output_tokens_per_s"] for c in out["candidates"]
                                                     if c["meets_limits"])
    json.dumps(out, allow_nan=False)


def test_no_feasible_layout_says_why(capsys):
    out = run_json(capsys, "llama-3.1-405b", "--device", "l4", "--num-devices", "1", "--input-length", "1024",
                   "--output-length", "128")
    assert out["best"] == {} and "memory" in out["why_no_feasible_layout"]
    out = run_json(capsys, "llama-3.2-1b", "--device", "h100", "--num-devices", "1", "--input-length", "1024",
                   "--output-length", "128", "--tpot-limit", "0.01")
    assert out["best"] == {} and "TPOT" in out["why_no_feasible_layout"]


@pytest.mark.parametrize("args", [
    ["--prefix-cache-hit-rate", "1.0"], ["--prefix-cache-hit-rate", "-0.1"], ["--input-length", "0"],
    ["--tp-sizes", "3"], ["--ttft-limit", "-5"], ["--device", "nope"], ["--ep-sizes", "2"],
    ["--request-rate", "nan"], ["--gpu-memory-utilization", "1.5"], ["--nodes", "2"],
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
                        "--tp-sizes", "1"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "best:" in r.stdout and "tokens/s" in r.stdout


def test_block_granular_hits_and_hit_rate_distribution(tmp_path, capsys):
    assert ServingShapes(1000, 10, 0.5, prefix_cache_block_size=16).cached_prefix_tokens == 496
    assert ServingShapes(1000, 10, 0.5).cached_prefix_tokens == 500
    rates = tmp_path / "rates.txt"
    rates.write_text("0\n0.5\n0.9\n0.9\n")
    base = ["llama-3.2-1b", "--device", "h100", "--num-devices", "1", "--input-length", "1000", "--output-length",
            "64", "--request-rate", "5"]
    dist = run_json(capsys, *base, "--prefix-cache-hit-rate-distribution", str(rates))
    assert dist["prefix_cache_hit_rate"] == pytest.approx(0.575)
    assert [d["weight"] for d in dist["hit_rate_distribution"]] == [0.25, 0.25, 0.5]
    cold = run_json(capsys, *base)
    warm = run_json(capsys, *base, "--prefix-cache-hit-rate", "0.9")
    assert warm["best"]["ttft_ms"]["mean"] < dist["best"]["ttft_ms"]["mean"] < cold["best"]["ttft_ms"]["mean"]
    rates.write_text("0.5\n1.2\n")
    assert main([*base, "--prefix-cache-hit-rate-distribution", str(rates)]) == 2


def test_pareto_and_launch_command(capsys):
    out = run_json(capsys, "llama-3.2-1b", "--device", "h100", "--num-devices", "1", "--input-length", "512",
                   "--output-length", "64", "--tpot-limit", "20", "--prefix-cache-hit-rate", "0.5", "--emit", "vllm")
    # one frontier per hit rate: the requested one and no hits, for the gain prefix caching buys
    assert set(out["pareto"]) == {"0.5", "0"}
    for points in out["pareto"].values():
        speeds = [p["tokens_per_s_per_user"] for p in points]
        rates = [p["tokens_per_s_per_gpu"] for p in points]
        assert speeds == sorted(speeds) and rates == sorted(rates, reverse=True)   # a frontier trades one for the other
    best = out["best"]
    cmd = out["launch_command"]
    assert "vllm serve meta-llama/Llama-3.2-1B" in cmd and "--enable-prefix-caching" in cmd
    assert f"--tensor-parallel-size {best['tp_size']}" in cmd and f"--max-num-seqs {best['max_num_seqs']}" in cmd
