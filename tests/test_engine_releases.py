"""Engine releases as data, the settings a run's flags state, and published rows mapped to setups."""
import json

import pytest

from cost.engines import engine_releases, parse_engine, release_key, resolve_overheads
from cost.profile import load_profile
from serving.engine_flags import stated_settings
from serving.published import map_row
from serving.steady_state import CONCURRENCY, MAX, RATE


def test_engine_names_take_an_optional_release():
    assert parse_engine("trtllm") == ("trtllm", None)
    assert parse_engine("TRTLLM==0.17") == ("trtllm", "0.17")
    with pytest.raises(ValueError, match="unknown engine 'tgi'"):
        parse_engine("tgi")
    with pytest.raises(ValueError, match="not a version"):
        parse_engine("vllm==latest")
    assert release_key("0.9") < release_key("0.17") < release_key("1.2.0rc1")


def test_the_newest_release_with_data_is_the_default_and_says_so():
    releases = engine_releases("trtllm")
    assert releases and releases == sorted(releases, key=release_key)
    newest = resolve_overheads("trtllm")
    assert newest.release == releases[-1] and "newest with data" in newest.origin
    oldest = resolve_overheads("trtllm", releases[0])
    assert oldest.release == releases[0] and "as asked" in oldest.origin
    with pytest.raises(ValueError, match="releases with data"):
        resolve_overheads("trtllm", "0.1")


def test_an_engine_without_its_own_rows_names_whose_overheads_it_borrows():
    for engine in ("vllm", "sglang"):
        r = resolve_overheads(engine)
        if r.release is None:
            assert r.origin.startswith("no ") and "end-to-end data" in r.origin


def test_kernel_fits_carry_the_release_their_tables_measured():
    assert load_profile("h100").engine("vllm").release == "0.24.0"
    assert load_profile("a100").engine("sglang").release == "0.5.10"


def test_cli_refuses_a_release_without_data(capsys):
    from cli.inference.throughput_optimizer import main
    with pytest.raises(SystemExit) as e:
        main(["llama-3.2-1b", "--device", "h100", "--engine", "trtllm==0.1"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "no TensorRT-LLM 0.1 data" in err and "kernel tables of older releases: 0.20, 1.0" in err


@pytest.mark.parametrize("flags, expected", [
    ("gpu_batch_size={'llama2-70b': 1024}; max_num_tokens=4096; kvcache_free_gpu_mem_frac=0.9",
     dict(max_num_seqs=1024, max_batched_tokens=4096, memory_fraction=0.9)),
    ("vllm serve m -tp 8 --enable-expert-parallel --max-num-seqs 256 --kv-cache-dtype fp8",
     dict(max_num_seqs=256, expert_parallel=True, kv_cache_dtype="fp8")),
    ("--max-num-seqs $SEQS --enable-chunked-prefill False --max-num-batched-tokens 131072",
     dict(max_num_seqs=None, chunked_prefill=False, max_batched_tokens=131072)),
    ("python -m sglang.launch_server --max-running-requests 512 --chunked-prefill-size 4096",
     dict(max_num_seqs=512, max_batched_tokens=4096)),
])
def test_stated_flags_become_settings(flags, expected):
    s = stated_settings(flags)
    for name, value in expected.items():
        assert getattr(s, name) == value, name


ROW = {"id": "x-Server", "source_kind": "mlperf_inference_v4.1", "engine": "TensorRT-LLM (NVIDIA MLPerf harness)",
       "engine_version": "TensorRT-LLM @daec483", "model": "meta-llama/Llama-2-70b-chat-hf", "precision": "fp8",
       "kv_cache_dtype": "fp8", "gpu": "H100-SXM-80GB", "tp": 2, "pp": 1, "dp": 4, "isl": 222.3, "osl": 290.9,
       "mode": "online_request_rate", "request_rate": 71.2, "num_requests": 172032,
       "ttft_ms": {"mean": 205.0, "p99": 350.7}, "tpot_ms": {"mean": 115.2, "p99": 125.4}, "output_tok_s": 20605.3,
       "engine_flags": "gpu_batch_size={'llama2-70b': 1024}; max_num_tokens=4096; kvcache_free_gpu_mem_frac=0.9"}


def test_an_mlperf_server_row_splits_its_rate_over_the_replicas():
    run, why = map_row(ROW)
    assert why is None
    assert (run.model, run.device, run.engine, run.release, run.tp, run.replicas) == \
        ("llama-2-70b", "h100", "trtllm", None, 2, 4)
    assert run.load.kind == RATE and run.load.value == pytest.approx(71.2 / 4) and run.load.spread == 4
    assert run.max_num_seqs == 1024 and run.max_batched_tokens == 4096
    assert run.latency_limits == {"ttft_ms": 2000.0, "tpot_ms": 200.0}
    assert run.measured == {"ttft_ms": 205.0, "tpot_ms": 115.2, "output_tok_s": 20605.3}


def test_burst_concurrency_and_batch_rows_become_their_loads():
    burst, _ = map_row({**ROW, "request_rate": None, "dp": 1, "num_requests": 1000, "engine": "vLLM",
                        "engine_version": "v0.11.0", "mode": "online_request_rate"})
    assert burst.load.kind == MAX and burst.load.requests == 1000 and burst.release == "0.11"
    closed, _ = map_row({**ROW, "request_rate": None, "concurrency": 64, "dp": 2, "mode": "online_concurrency"})
    assert closed.load.kind == CONCURRENCY and closed.load.value == 32
    batch, _ = map_row({**ROW, "mode": "offline_batch", "batch_size": 16, "request_rate": None, "dp": 1,
                        "engine": "vLLM offline (benchmark_latency.py) ROCm", "gpu": "MI300X-192GB",
                        "engine_version": "ROCm 6.3.1, vLLM 0.6.6, PyTorch 2.6dev", "e2e_latency_ms": {"mean": 19088.6}})
    assert batch.load.kind == MAX and batch.load.requests == 16 and batch.release == "0.6"
    assert batch.measured == {"ttft_ms": 205.0, "tpot_ms": 115.2, "e2e_latency_ms": 19088.6}


@pytest.mark.parametrize("change, reason", [
    ({"model": "org/unknown"}, "is not bundled"),
    ({"gpu": "Gaudi3-128GB"}, "no profile for Gaudi3-128GB"),
    ({"spec_decode": {"method": "EAGLE3"}}, "speculative tokens per step not stated"),
    ({"isl": None}, "lengths not stated"),
    ({"precision": "bitsandbytes"}, "not modelled"),
])
def test_rows_tracecost_cannot_price_are_skipped_with_the_reason(change, reason):
    run, why = map_row(json.loads(json.dumps({**ROW, **change})))
    assert run is None and reason in why


def test_a_row_naming_only_its_libraries_is_placed_on_their_release_and_a_commit_wins():
    from serving.published_rows import stated_release
    assert stated_release("trtllm", "TensorRT 9.3.0, CUDA 12.2") == "0.9"        # MLPerf v4.0's NVIDIA rows
    assert stated_release("trtllm", "TensorRT 9.30.1") is None                    # no prefix match of another version
    # MLPerf v4.1 partners state TensorRT 9.3.0 beside the same commit NVIDIA states 10.2.0 with: the commit rules
    assert stated_release("trtllm", "TensorRT-LLM @daec483b860141ea1a0f7f54e4a12c149d1d3bc1 (TensorRT 9.3.0, CUDA 12.2)") is None
    assert stated_release("trtllm", "TensorRT-LLM v0.17.0 (TensorRT 10.8)") == "0.17"
    assert stated_release("vllm", "TensorRT 9.3.0") is None
