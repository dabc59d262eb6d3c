"""RFC section 6 for text_generate, plus memory, sweep and bad-input behaviour."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli.inference.config import InputError, UserInputConfig
from cli.inference.text_generate import main

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args):
    """The CLI as a user runs it: a subprocess."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "cli.inference.text_generate", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)


def run_json(capsys, *args):
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_default_rate_is_zero():
    assert UserInputConfig(1, 200).prefix_cache_hit_rate == 0.0


def test_rfc_example_lengths():
    info = UserInputConfig(num_queries=1, query_length=200, context_length=1000, prefix_cache_hit_rate=0.5) \
        .get_request_info()
    assert (info.context_len, info.query_len, info.seq_len, info.cached_tokens) == (1100, 100, 1200, 100)


def test_rfc_example_through_the_cli(capsys):
    out = run_json(capsys, "llama-3.2-1b", "--device", "h200", "--num-queries", "1", "--query-length", "200",
                   "--context-length", "1000", "--prefix-cache-hit-rate", "0.5")
    r = out["request"]
    assert (r["context_length"], r["query_length"], r["seq_len"], r["cached_tokens"]) == (1100, 100, 1200, 100)
    assert r["prefix_cache_hit_rate"] == 0.5
    for key in ("model", "device", "phase", "execution", "latency_ms", "breakdown_ms", "flops", "bytes",
                "throughput_tokens_per_s", "memory_gb"):
        assert key in out
    assert set(out["breakdown_ms"]) == {"gemm", "attention", "communication", "other"}
    assert set(out["memory_gb"]) == {"weights", "kv_cache", "activations", "total", "capacity"}
    assert out["latency_ms"] == pytest.approx(sum(out["breakdown_ms"].values()))


def test_rate_zero_equals_no_flag(capsys):
    base = ["qwen2.5-7b", "--device", "h100", "-b", "2", "-q", "512", "-c", "128"]
    assert run_json(capsys, *base) == run_json(capsys, *base, "--prefix-cache-hit-rate", "0")


def test_hit_rate_lowers_ttft_but_not_seq_len_or_kv_memory(capsys):
    base = ["llama-3.1-8b", "--device", "h200", "-b", "4", "-q", "2048", "-c", "0"]
    cold = run_json(capsys, *base)
    warm = run_json(capsys, *base, "--prefix-cache-hit-rate", "0.5")
    assert warm["latency_ms"] < cold["latency_ms"]
    assert warm["request"]["seq_len"] == cold["request"]["seq_len"] == 2048
    assert warm["memory_gb"]["kv_cache"] == cold["memory_gb"]["kv_cache"]


@pytest.mark.parametrize("rate", ["-0.1", "1.0", "abc", "1.5", "nan"])
def test_invalid_rates_exit_2(rate, capsys):
    with pytest.raises(SystemExit) as e:
        main(["llama-3.2-1b", "--device", "h200", "--prefix-cache-hit-rate", rate])
    assert e.value.code == 2
    assert "prefix-cache-hit-rate" in capsys.readouterr().err


def test_valid_rate_half(capsys):
    out = run_json(capsys, "llama-3.2-1b", "--device", "h200", "-q", "10", "--prefix-cache-hit-rate", "0.5")
    assert out["request"]["query_length"] == 5


def test_zero_effective_length_is_rejected():
    with pytest.raises(InputError):
        UserInputConfig(1, 0, 0, prefix_cache_hit_rate=0.5).get_request_info()
    # floor(Q * rate) < Q for any rate < 1, so one token is always left to compute
    assert UserInputConfig(1, 1, 0, prefix_cache_hit_rate=0.99).get_request_info().query_len == 1


def test_decode_with_rate_warns_and_ignores_it(capsys):
    args = ["llama-3.2-1b", "--device", "h200", "-b", "8", "--decode", "-c", "1000"]
    plain = run_json(capsys, *args)
    assert main([*args, "--prefix-cache-hit-rate", "0.5", "--json"]) == 0
    captured = capsys.readouterr()
    assert "warning" in captured.err and "ignored" in captured.err
    with_rate = json.loads(captured.out)
    assert with_rate["latency_ms"] == plain["latency_ms"]
    assert with_rate["request"]["cached_tokens"] == 0 and with_rate["phase"] == "decode"


def test_memory_warning_when_it_does_not_fit(capsys):
    assert main(["llama-3.1-405b", "--device", "h100", "-q", "128"]) == 0
    assert "does not fit" in capsys.readouterr().out
    out = run_json(capsys, "llama-3.1-405b", "--device", "h100", "-q", "128", "--tp-size", "8", "--dtype", "fp8")
    # linear layers at one byte a weight; the embedding and lm_head (128256 x 16384 each) stay bf16
    assert out["fits_in_memory"] and out["memory_gb"]["weights"] == pytest.approx(
        (405.85 + 2 * 128256 * 16384 / 1e9) / 8, rel=0.002)


def test_sweep_table(capsys):
    assert main(["llama-3.2-1b", "--device", "h200", "-q", "1024", "--sweep-prefix-cache-hit-rate",
                 "0,0.5,0.9", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["sweep"]
    assert [r["effective_query_length"] for r in rows] == [1024, 512, 103]
    assert rows[0]["speedup"] == 1.0 and rows[0]["ttft_ms"] > rows[1]["ttft_ms"] > rows[2]["ttft_ms"]


def test_cli_subprocess_report_and_errors():
    ok = run_cli("llama-3.2-1b", "--device", "H200", "-q", "256", "-c", "256", "--prefix-cache-hit-rate", "0.5")
    assert ok.returncode == 0, ok.stderr
    assert "TTFT (prefill)" in ok.stdout and "memory per device" in ok.stdout
    for args, needle in [(["nope-model", "--device", "h200"], "unknown model"),
                         (["llama-3.2-1b", "--device", "tpu-v9"], "unknown device"),
                         (["llama-3.2-1b", "--device", "h200", "-q", "0"], "query-length"),
                         (["llama-3.2-1b", "--device", "h200", "--prefix-cache-hit-rate", "1.0"], "hit-rate")]:
        bad = run_cli(*args)
        assert bad.returncode == 2, (args, bad.stderr)
        assert needle in bad.stderr and "Traceback" not in bad.stderr
        assert bad.stderr.strip().count("\n") == 0


def test_kv_cache_dtype_execution_and_expert_parallel_flags(capsys):
    base = ["qwen3-30b-a3b", "--device", "h200", "-b", "32", "--decode", "-c", "4096"]
    bf16 = run_json(capsys, *base)
    fp8 = run_json(capsys, *base, "--kv-cache-dtype", "fp8")
    assert fp8["memory_gb"]["kv_cache"] == pytest.approx(bf16["memory_gb"]["kv_cache"] / 2)
    assert fp8["breakdown_ms"]["attention"] < bf16["breakdown_ms"]["attention"]
    eager = run_json(capsys, *base, "--execution", "eager")
    assert eager["execution"] == "eager" and eager["latency_ms"] > bf16["latency_ms"]
    assert eager["wall_ms"] >= eager["latency_ms"] and eager["host_ms"] > bf16["host_ms"]
    ep = run_json(capsys, *base, "--tp-size", "4", "--ep-size", "4")
    assert ep["breakdown_ms"]["communication"] > 0 and ep["memory_gb"]["weights"] < bf16["memory_gb"]["weights"] / 3


def test_plot_draws_or_explains(tmp_path, capsys):
    out = tmp_path / "ttft.png"
    assert main(["llama-3.2-1b", "--device", "h200", "-q", "256", "--sweep-prefix-cache-hit-rate", "0,0.5",
                 "--plot", str(out)]) == 0
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "needs matplotlib" in capsys.readouterr().err and not out.exists()
    else:
        assert out.stat().st_size > 0


def test_an_ep_style_without_expert_parallelism_is_warned_about(capsys):
    assert main(["llama-3.2-1b", "--device", "h100", "-q", "64", "--ep-style", "dispatch", "--json"]) == 0
    out = capsys.readouterr()
    assert "--ep-style dispatch has no effect" in out.err
    assert any("--ep-style dispatch has no effect" in w for w in json.loads(out.out)["warnings"])
    assert main(["llama-3.2-1b", "--device", "h100", "-q", "64"]) == 0
    assert "--ep-style" not in capsys.readouterr().err
