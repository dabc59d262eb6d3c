"""Issue 23 item 3: odd input answered rightly (a one-line refusal with exit 2, a warning, or the meaning the
flag's help gives), each case of the issue's list one test. bench/odd_inputs.py runs the same classes wider."""
import importlib.util
import json

import pytest

from cli.inference import serving_sim, text_generate, throughput_optimizer
from tracer import __main__ as tracer_cli

OPTIMIZER = ["llama-3.2-1b", "--device", "h100", "--input-length", "512", "--output-length", "64"]
SIM = ["llama-3.2-1b", "--device", "h200", "--jobs", "1"]


def refused(main, argv, capsys) -> str:
    """The one-line error a command gives (exit 2, no traceback), from argparse or the command's body."""
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("mode", ["mixed", "disagg"])
def test_ten_million_devices_refused_not_searched(mode, capsys):
    err = refused(throughput_optimizer.main, [*OPTIMIZER, "--num-devices", "1e7", "--mode", mode], capsys)
    assert "TRACECOST_MAX_DEVICES" in err and "10,000,000" in err


def test_nodes_beyond_the_device_limit_refused(capsys):
    assert "TRACECOST_MAX_DEVICES" in refused(throughput_optimizer.main, [*OPTIMIZER, "--nodes", "1e6"], capsys)


@pytest.mark.parametrize("main, argv", [
    (throughput_optimizer.main, [*OPTIMIZER, "--num-devices", "1"]),
    (text_generate.main, ["llama-3.2-1b", "--device", "h200", "--sweep-prefix-cache-hit-rate", "0,0.5"]),
    (serving_sim.main, [*SIM, "--workload", "random", "--num-requests", "4"]),
])
def test_plot_name_without_a_known_extension_refused(main, argv, tmp_path, capsys):
    err = refused(main, [*argv, "--plot", str(tmp_path / "frontier")], capsys)
    assert "no extension" in err and "frontier.png" in err
    assert not list(tmp_path.iterdir())
    if importlib.util.find_spec("matplotlib") is not None:   # without it no plot is written, whatever the name
        assert "not a format" in refused(main, [*argv, "--plot", str(tmp_path / "frontier.xyz")], capsys)


def test_sweep_and_a_single_hit_rate_do_not_combine(capsys):
    err = refused(text_generate.main, ["llama-3.2-1b", "--device", "h200", "--sweep-prefix-cache-hit-rate", "0,0.5",
                                       "--prefix-cache-hit-rate", "0.2"], capsys)
    assert "not allowed with" in err


def test_tracer_warns_beyond_max_position_embeddings(capsys):
    assert tracer_cli.main(["mistral-7b", "-q", "40000", "--json"]) == 0
    captured = capsys.readouterr()
    assert "warning: 40,000 tokens" in captured.err and "32,768" in captured.err
    assert any("maximum context" in w for w in json.loads(captured.out)["warnings"])
    assert tracer_cli.main(["mistral-7b", "-q", "32768", "--json"]) == 0
    captured = capsys.readouterr()
    assert "warning" not in captured.err and json.loads(captured.out)["warnings"] == []


@pytest.mark.parametrize("main, argv, env", [
    (throughput_optimizer.main, [*OPTIMIZER, "--num-devices", "1", "--prefix-cache-block-size", "1e12"],
     "TRACECOST_MAX_TOKENS"),
    (throughput_optimizer.main, [*OPTIMIZER, "--num-devices", "1", "--max-num-seqs", "1e12"], "TRACECOST_MAX_RUNNING"),
    (throughput_optimizer.main, [*OPTIMIZER, "--num-devices", "1", "--max-prefill-tokens", "1e12"],
     "TRACECOST_MAX_BATCH_TOKENS"),
    (serving_sim.main, [*SIM, "--workload", "random", "--max-running", "1e12"], "TRACECOST_MAX_RUNNING"),
    (serving_sim.main, [*SIM, "--workload", "random", "--max-prefill-tokens", "1e12"], "TRACECOST_MAX_BATCH_TOKENS"),
])
def test_huge_engine_sizes_refused_with_the_way_to_raise_them(main, argv, env, capsys):
    assert env in refused(main, argv, capsys)


def test_huge_top_refused(capsys):
    assert "<= 1000" in refused(throughput_optimizer.main, [*OPTIMIZER, "--num-devices", "1", "--top", "1e9"], capsys)


def test_block_larger_than_the_hit_tokens_warns(capsys):
    assert throughput_optimizer.main([*OPTIMIZER, "--num-devices", "1", "--prefix-cache-hit-rate", "0.5",
                                      "--prefix-cache-block-size", "4096", "--json"]) == 0
    captured = capsys.readouterr()
    assert "nothing is cached" in captured.err
    out = json.loads(captured.out)
    assert out["cached_prefix_tokens"] == 0 and any("nothing is cached" in w for w in out["warnings"])


def test_hit_rate_distribution_states_that_its_mean_is_priced(tmp_path, capsys):
    rates = tmp_path / "rates.txt"
    rates.write_text("0.1\n0.9\n0.5\n")
    argv = [*OPTIMIZER, "--num-devices", "1", "--prefix-cache-hit-rate-distribution", str(rates)]
    assert throughput_optimizer.main([*argv, "--request-rate", "5", "--json"]) == 0
    captured = capsys.readouterr()
    assert "mean hit rate 0.5" in captured.err and "not modelled" in captured.err
    out = json.loads(captured.out)
    assert out["prefix_cache_hit_rate"] == pytest.approx(0.5) and any("mean hit rate" in w for w in out["warnings"])
    assert "not allowed with" in refused(throughput_optimizer.main, [*argv, "--prefix-cache-hit-rate", "0.2"], capsys)


@pytest.mark.parametrize("flags", [["--num-requests", "1"], ["--request-rate", "3"]])
def test_trace_file_refuses_preset_load_flags(flags, tmp_path, capsys):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"arrival_s": t, "segments": [{"id": "s", "tokens": 64}], "output_tokens": 4})
                             + "\n" for t in (0.0, 0.1)))
    err = refused(serving_sim.main, [*SIM, "--workload", str(trace), *flags], capsys)
    assert flags[0] in err and "replayed whole" in err


def test_infinite_latency_limit_means_no_limit(capsys):
    argv = [*OPTIMIZER, "--num-devices", "1", "--json"]
    assert throughput_optimizer.main([*argv, "--ttft-limit", "inf", "--tpot-limit", "inf"]) == 0
    unlimited = json.loads(capsys.readouterr().out)
    assert throughput_optimizer.main(argv) == 0
    default = json.loads(capsys.readouterr().out)
    assert unlimited["limits"] == default["limits"]
    assert {k: default["limits"][k] for k in ("ttft_ms", "tpot_ms", "ttft_stat")} == \
        {"ttft_ms": None, "tpot_ms": None, "ttft_stat": "mean"}
    assert unlimited["best"]["output_tokens_per_s"] == default["best"]["output_tokens_per_s"]
    for bad in ("nan", "0", "-5", "abc"):
        assert "--ttft-limit" in refused(throughput_optimizer.main, [*argv, f"--ttft-limit={bad}"], capsys)


@pytest.mark.parametrize("flags, env", [
    (["--input-length", "1e12"], "TRACECOST_MAX_TOKENS"),       # was traced until the storage size overflowed
    (["--output-length", "1e12"], "TRACECOST_MAX_TOKENS"),
    (["--concurrency", "1e15"], "TRACECOST_MAX_REQUESTS"),      # was answered with a TTFT of 10^16 ms
    (["--num-requests", "1e15"], "TRACECOST_MAX_REQUESTS"),
])
def test_optimizer_refuses_work_beyond_the_limits(flags, env, capsys):
    argv = ["llama-3.2-1b", "--device", "h100", "--num-devices", "1", "--input-length", "512", "--output-length", "64"]
    assert env in refused(throughput_optimizer.main, [*argv, *flags], capsys)
