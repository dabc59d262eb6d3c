"""The KV capacity an engine logged, priced in place of tracecost's estimate: throughput_optimizer --kv-cache-tokens
(one layout, mixed mode; with --speculative the speculating server's). The published rows that state theirs and
--from-serving's flag are tested beside their data (test_speculative_published.py, test_calibrate_serving.py)."""
import json

import pytest

from cli.inference.throughput_optimizer import main

RUN = ["llama-3.1-8b", "--device", "h100", "--num-devices", "1", "--input-length", "1000", "--output-length", "200",
       "--concurrency", "64", "--json"]


def best(capsys, *extra) -> dict:
    assert main(RUN + list(extra)) == 0
    return json.loads(capsys.readouterr().out)["best"]


def test_a_logged_capacity_that_binds_changes_the_answer_and_says_so(capsys):
    estimated = best(capsys)
    logged = best(capsys, "--kv-cache-tokens", "20000")
    assert estimated["kv_tokens_per_replica"] > 400_000 and estimated["limited_by"] != "kv_cache"
    assert logged["kv_tokens_per_replica"] == 20_000 and logged["limited_by"] == "kv_cache"
    # 64 users of 1,200 tokens need 77K: the logged 20K runs fewer at once, and serves fewer tokens/s
    assert logged["batch_size"] < 20_000 / 1000 < estimated["batch_size"]
    assert logged["output_tokens_per_s"] < 0.6 * estimated["output_tokens_per_s"]
    note = next(n for n in logged["notes"] if n.startswith("KV cache"))
    assert "20,000 tokens per replica as the engine logged" in note
    assert f"{estimated['kv_tokens_per_replica']:,}" in note


def test_with_speculation_the_logged_capacity_is_the_speculating_servers(capsys):
    assert main(RUN + ["--kv-cache-tokens", "20000", "--speculative", "eagle3", "--num-speculative-tokens", "3"]) == 0
    out = capsys.readouterr()
    rows = {c.get("speculation"): c for c in json.loads(out.out)["candidates"]}
    assert rows["eagle3 k=3"]["kv_tokens_per_replica"] == 20_000
    assert rows[None]["kv_tokens_per_replica"] > 400_000          # the plain baseline keeps the estimate
    assert "plain baseline at tracecost's own estimate" in out.err


@pytest.mark.parametrize("extra, message", [
    (["--num-devices", "8"], "pin one with --tp-sizes"),
    (["--mode", "both"], "use --mode mixed"),
    (["--kv-cache-tokens", str(10**10)], "beyond any server's cache"),
])
def test_a_logged_capacity_that_cannot_name_one_server_is_refused(capsys, extra, message):
    argv = RUN + ["--kv-cache-tokens", "20000"] + extra
    if extra[0] == "--num-devices":
        argv = [a for i, a in enumerate(argv) if not (a == "--num-devices" or argv[i - 1] == "--num-devices")] + extra
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_a_logged_capacity_beyond_what_memory_holds_is_flagged(capsys):
    far = best(capsys, "--kv-cache-tokens", "5000000")
    note = next(n for n in far["notes"] if n.startswith("KV cache"))
    assert "what the memory holds beside the weights" in note and "check the number" in note
    near = best(capsys, "--kv-cache-tokens", "450000")          # within the estimate's error: taken as logged
    assert "check the number" not in next(n for n in near["notes"] if n.startswith("KV cache"))


def test_serving_sim_simulates_the_cache_the_engine_logged(capsys):
    """serving_sim --kv-cache-tokens N: N tokens of blocks per instance (the null block among them), in place of
    the cache the memory budget leaves; a cache too small to hold the load then preempts."""
    from cli.inference.serving_sim import main as sim_main
    argv = ["llama-3.1-8b", "--device", "h100", "--workload", "random", "--num-requests", "64", "--jobs", "1",
            "--input-tokens", "1024", "--json"]
    assert sim_main(argv) == 0
    auto = json.loads(capsys.readouterr().out)
    assert sim_main(argv + ["--kv-cache-tokens", "8000"]) == 0
    logged = json.loads(capsys.readouterr().out)
    (a,), (b,) = auto["runs"].values(), logged["runs"].values()
    assert "as the engine logged them (--kv-cache-tokens), 500 blocks of 16" in " ".join(logged["pricing_notes"])
    assert b["kv_memory_gb"]["gpu_capacity"] < a["kv_memory_gb"]["gpu_capacity"] / 10
    assert b["preemptions"]["count"] > a["preemptions"]["count"] == 0
    with pytest.raises(SystemExit) as refused:       # argparse's own exit: two sizes given
        sim_main(argv + ["--kv-cache-tokens", "8000", "--gpu-cache-gb", "4"])
    assert refused.value.code == 2 and "drop --gpu-cache-gb" in capsys.readouterr().err
    assert sim_main(argv + ["--kv-cache-tokens", "10"]) == 2
    assert "too small" in capsys.readouterr().err
