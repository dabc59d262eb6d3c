"""Streaming clients (cost/engines.py ServingOverheads.stream_us): a response per running request per step, paid
where the client takes every token as it comes (MLPerf Server/Interactive, served benchmarks, --stream)."""
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from cost.engines import resolve_overheads
from cost.profile import load_profile
from serving.calibrate_stream import (OBJECTIVES, interpolated, main as calibrate_stream, mean_loss, objective_loss,
                                     operating_point_errors, streamed_limit_runs)
from serving.published import Predictor
from serving.published import map_row
from serving.step_cost import StepCost
from tracer.model_source import resolve_model
from tracer.work import TraceOptions

ROOT = Path(__file__).resolve().parents[1]
SERVER = {"id": "x-Server", "source_kind": "mlperf_inference_v4.1", "engine": "TensorRT-LLM (NVIDIA MLPerf harness)",
          "engine_version": "TensorRT-LLM @daec483", "model": "meta-llama/Llama-2-70b-chat-hf", "precision": "fp8",
          "kv_cache_dtype": "fp8", "gpu": "H100-SXM-80GB", "tp": 2, "pp": 1, "dp": 4, "isl": 222.3, "osl": 290.9,
          "mode": "online_request_rate", "request_rate": 71.2, "num_requests": 172032,
          "ttft_ms": {"mean": 205.0}, "tpot_ms": {"mean": 115.2}, "output_tok_s": 20605.3,
          "engine_flags": "gpu_batch_size={'llama2-70b': 1024}; max_num_tokens=4096"}


def test_who_streams():
    server, _ = map_row(SERVER)
    offline, _ = map_row({**SERVER, "id": "x-Offline", "mode": "offline_max_throughput", "request_rate": None})
    table, _ = map_row({**SERVER, "id": "t", "source_kind": "trtllm_v017_maxtput", "mode": "offline_max_throughput",
                        "request_rate": None, "engine_flags": "trtllm-bench throughput"})
    served, _ = map_row({**SERVER, "id": "g", "source_kind": "gpustack_perflab_vllm_bench", "request_rate": None,
                         "num_requests": 1000, "dp": 1, "engine_flags": "vllm serve meta-llama/Llama-2-70b-chat-hf"})
    assert server.streams and served.streams and not offline.streams and not table.streams


def test_a_streaming_step_pays_a_response_per_running_request():
    spec, hw = resolve_model("llama-3.2-1b"), load_profile("h100")
    plain = StepCost(spec, hw, TraceOptions(), "engine", 1, "trtllm")
    streaming = StepCost(spec, hw, TraceOptions(), "engine", 1, "trtllm", streams=True)
    per_seq_us = plain.overheads.stream_us
    assert per_seq_us > 0
    for sequences in (1, 64, 512):
        extra = streaming.beyond_kernels(sequences, sequences, 0.01, True) - plain.beyond_kernels(sequences, sequences,
                                                                                                  0.01, True)
        assert extra == pytest.approx(per_seq_us * sequences * 1e-6)
    # vLLM's and SGLang's per-request terms were fitted on streamed runs only: no second term
    assert resolve_overheads("vllm").params.stream_us == 0 and resolve_overheads("sglang").params.stream_us == 0


def _optimizer(*extra):
    done = subprocess.run([sys.executable, "-m", "cli.inference.throughput_optimizer", "llama-3.2-1b", "--device", "h100",
                           "--num-devices", "1", "--engine", "trtllm", "--input-length", "500", "--output-length", "500",
                           "--tp-sizes", "1", "--json", *extra], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_no_stream_serves_more_at_large_batch():
    streamed, whole = _optimizer(), _optimizer("--no-stream")
    best = lambda r: r["best"]["output_tokens_per_s"]   # noqa: E731
    assert best(whole) > best(streamed) * 1.02


def test_interpolated_rate_errors_and_their_loss():
    errors = {0.0: 0.20, 10.0: 0.10, 20.0: 0.0}
    assert interpolated(errors, 5.0) == pytest.approx(0.15) and interpolated(errors, 25.0) == 0.0
    assert mean_loss([errors], 20.0) == 0.0 < mean_loss([errors], 10.0)


def test_the_objective_weighs_each_metric_alike():
    rate = [{0.0: 0.5, 30.0: 0.0}]                 # the rate alone wants 30
    ttft = [{0.0: 0.0, 30.0: 1.0}, {0.0: 0.0, 30.0: 1.0}]   # past the cliff at 30: TTFT wants 0
    both = {"rate": rate, "ttft_ms": ttft}
    assert objective_loss(both, 15.0) == pytest.approx((mean_loss(rate, 15.0) + mean_loss(ttft, 15.0)) / 2)
    assert objective_loss({"rate": rate}, 30.0) < objective_loss({"rate": rate}, 0.0)
    assert objective_loss({"rate": [], "ttft_ms": []}, 1.0) == float("inf")
    assert OBJECTIVES["both"] == ("rate", "ttft_ms", "tpot_ms") and OBJECTIVES["rate"] == ("rate",)


def test_the_operating_point_errors_price_the_streaming_cost_asked_and_leave_the_fit_as_it_was():
    server, _ = map_row(SERVER)
    predictor = Predictor()
    fitted = predictor.cost(server).overheads
    none, some = operating_point_errors(predictor, server, 0.0), operating_point_errors(predictor, server, 40.0)
    assert set(none) == set(some) == {"ttft_ms", "tpot_ms"}
    assert some["tpot_ms"] > none["tpot_ms"]          # a response per running request per step slows each step
    assert predictor.cost(server).overheads == fitted


def test_stream_fit_refuses_bad_arguments(capsys):
    assert calibrate_stream(["--grid", "10"]) == 2
    assert calibrate_stream(["--grid", "a,b"]) == 2
    assert calibrate_stream(["--data", "/nonexistent.jsonl"]) == 2
    assert "no such file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        calibrate_stream(["--objective", "median"])
    assert e.value.code == 2


def test_stream_fit_takes_streamed_runs_with_limits_only():
    server, _ = map_row(SERVER)
    offline, _ = map_row({**SERVER, "id": "x-Offline", "mode": "offline_max_throughput", "request_rate": None})
    no_limits = replace(server, latency_limits={})
    assert streamed_limit_runs([server, offline, no_limits], "trtllm") == [server]
    assert streamed_limit_runs([server], "vllm") == []


def test_the_json_says_whether_tokens_streamed():
    assert _optimizer()["streams"] is True and _optimizer("--no-stream")["streams"] is False


def test_serving_measurements_know_who_streamed(tmp_path):
    """--from-serving prices each measurement as its client took its tokens."""
    from serving.measurements import load_file
    rows = [{**SERVER, "gpu": "H100-SXM-80GB"},
            {**SERVER, "id": "x-Offline", "mode": "offline_max_throughput", "request_rate": None}]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    server, offline = load_file(str(path))
    assert server.streams and not offline.streams
