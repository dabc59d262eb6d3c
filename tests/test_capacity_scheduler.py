"""TensorRT-LLM's capacity scheduler (serving/capacity.py KV_ADMISSION): a launch states it, NVIDIA's MLPerf
harness defaults it to MAX_UTILIZATION, and it sets how many requests the KV cache admits; a development-set row
reads the same way for the accuracy bench and for `--from-serving`."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from serving.capacity import kv_admission, output_kv_share
from serving.engine_flags import stated_settings
from serving.measurements import load_file
from serving.published import Predictor, map_row

ROOT = Path(__file__).resolve().parents[1]

SERVER_ROW = {"id": "t-Server", "source": "closed/NVIDIA/results/DGX-H100_H100-SXM-80GBx8_TRT/llama2-70b-99/x",
              "source_kind": "mlperf_inference_v4.1", "engine": "TensorRT-LLM (NVIDIA MLPerf harness)",
              "engine_version": "TensorRT-LLM 0.12", "model": "meta-llama/Llama-2-70b-chat-hf",
              "precision": "fp8", "kv_cache_dtype": "fp8", "gpu": "H100-SXM-80GB", "num_gpus": 8, "tp": 2, "dp": 4,
              "isl": 222.3, "osl": 291.0, "mode": "online_request_rate", "request_rate": 75.0,
              "output_tok_s": 21600.0, "tpot_ms": {"mean": 155.0},
              "engine_flags": "gpu_batch_size={'llama2-70b': 1024}; max_num_tokens=4096"}


@pytest.mark.parametrize("flags, policy", [
    ("trtllm_batch_sched_policy=no_evict", "guaranteed_no_evict"),
    ("--scheduler_policy max_utilization", "max_utilization"),
    ("scheduler_config:\n  capacity_scheduler_policy: MAX_UTILIZATION", "max_utilization"),
    ("batch_scheduler_policy:guaranteed_completion", "guaranteed_no_evict"),
    ("batch_scheduler_policy=$POLICY", None),              # a placeholder states nothing
])
def test_each_launchers_spelling_of_the_policy(flags, policy):
    assert stated_settings(flags).capacity_scheduler == policy


def test_the_mlperf_harness_defaults_to_max_utilization_and_a_stated_policy_wins():
    harness = "TensorRT-LLM (NVIDIA MLPerf harness)"
    assert stated_settings(None, harness).capacity_scheduler == "max_utilization"
    assert stated_settings("trtllm_batch_sched_policy=no_evict", harness).capacity_scheduler == "guaranteed_no_evict"
    assert stated_settings(None, "TensorRT-LLM (NVIDIA MLPerf harness, Triton server)").capacity_scheduler is None
    assert stated_settings(None, "trtllm-bench").capacity_scheduler is None


def test_policy_sets_the_output_share_a_running_request_holds():
    assert output_kv_share("trtllm") == 1.0 and kv_admission("trtllm") == "guaranteed_no_evict"
    assert output_kv_share("trtllm", "max_utilization") == output_kv_share("vllm") == 0.5
    with pytest.raises(ValueError, match="not one of sglang's"):
        kv_admission("sglang", "guaranteed_no_evict")


def test_harness_rows_admit_what_fits_now():
    """The DGX H100 TP2 replica held ~843 requests at 155 ms per token (Little's law): a whole-output reservation
    admits far fewer than MAX_UTILIZATION does."""
    run, why = map_row(SERVER_ROW)
    assert why is None and run.capacity_scheduler == "max_utilization"
    predictor = Predictor()
    packs = predictor.limits(run, predictor.cost(run))
    assert packs.output_kv_share == 0.5
    reserved, _ = map_row({**SERVER_ROW, "engine_flags": SERVER_ROW["engine_flags"] + "; trtllm_batch_sched_policy=no_evict"})
    assert predictor.limits(reserved, predictor.cost(reserved)).output_kv_share == 1.0


def test_from_serving_reads_a_row_as_the_accuracy_bench_does(tmp_path):
    """One reader of a development-set row: the measurement takes the bundled model, the GPU's profile and
    topology, and the formats the predictor prices, and its settings carry the launcher's policy."""
    rows = [SERVER_ROW,
            {**SERVER_ROW, "id": "u-Offline", "gpu": "B200-SXM-180GB", "tp": 1, "dp": 8, "kv_cache_dtype": None,
             "precision": "fp8 (pre-quantized FP8 checkpoint)", "mode": "offline_max_throughput",
             "request_rate": None, "num_requests": 24576, "tpot_ms": None, "engine": "TensorRT-LLM",
             "source": "closed/Dell/results/XE8640_H100_SXM_80GBx4_TRT/llama2-70b-99/Offline/x",
             "engine_flags": "--kv-cache-dtype fp8"}]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    for m, row in zip(load_file(str(path)), rows):
        run, why = map_row(row)
        assert why is None
        assert (m.model, m.device, m.dtype, m.kv_dtype, m.lengths) == \
               (run.model, run.device.partition("@")[0], run.dtype, run.kv_dtype, run.lengths)
        assert m.settings.capacity_scheduler == run.capacity_scheduler
    assert load_file(str(path))[1].kv_dtype == "fp8"          # from the launch flags, as map_row reads them


def test_optimizer_takes_the_policy_for_tensorrt_llm_only():
    base = [sys.executable, "-m", "cli.inference.throughput_optimizer", "llama-3.2-1b", "--device", "h100",
            "--num-devices", "1", "--input-length", "512", "--output-length", "128", "--json"]
    out = subprocess.run(base + ["--engine", "trtllm", "--capacity-scheduler", "max_utilization", "--emit",
                                 "trtllm"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["kv_admission"] == "max_utilization"
    assert "capacity_scheduler_policy: \"MAX_UTILIZATION\"" in result["launch_command"]
    bad = subprocess.run(base + ["--engine", "vllm", "--capacity-scheduler", "max_utilization"],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "TensorRT-LLM's" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize("policy", [None, "max_utilization"])
def test_each_policys_capacity_agrees_with_the_event_simulation(policy):
    """A KV-bound TensorRT-LLM replica: the steady state's highest rate within p99 limits and the simulator's agree
    under either policy (the simulator reserves whole sequences under guaranteed_no_evict), and the policies
    differ by far more than that agreement."""
    from cost.engines import ServingOverheads
    from cost.profile import load_profile
    from serving.layouts import Layout
    from serving.search import EngineSettings, LatencyLimits, Searcher, Workload
    from serving.verify import simulated_best_rate
    from tracer import TraceOptions, resolve_model
    pinned = ServingOverheads(step_us=150.0, seq_us=0.25, gpu_sync_us=400.0, request_ms=5.0, reserve_gb=0.5)
    rates = {}
    for p in (None, "max_utilization"):
        s = Searcher(resolve_model("llama-3.2-1b"), load_profile("h100"), TraceOptions(), Workload(200, 800),
                     EngineSettings(engine="trtllm", memory_fraction=0.02, overheads=pinned, capacity_scheduler=p),
                     LatencyLimits(1000, 30, "p99"))
        rates[p] = (s, s.best_rate(Layout(1)).request_rate)
    s, rate = rates[policy]
    simulated, _ = simulated_best_rate(s, Layout(1), rate)
    assert simulated == pytest.approx(rate, rel=0.10)
    assert rates["max_utilization"][1] > 1.3 * rates[None][1]


def test_serving_sim_reserves_under_the_default_policy(tmp_path):
    from cli.inference.serving_sim import main as sim_main
    lengths = tmp_path / "lengths.csv"
    lengths.write_text("isl,osl\n200,800\n")
    base = ["llama-3.2-1b", "--device", "h100", "--engine", "trtllm", "--lengths-file", str(lengths),
            "--num-requests", "300", "--gpu-cache-gb", "0.5", "--json"]
    import io, contextlib
    outs = {}
    for extra in ([], ["--capacity-scheduler", "max_utilization"]):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert sim_main(base + extra) == 0
        outs[bool(extra)] = json.loads(buf.getvalue())
    reserved, packed = outs[False], outs[True]
    assert reserved["kv_admission"] == "guaranteed_no_evict" and packed["kv_admission"] == "max_utilization"
    run = lambda o: next(iter(o["runs"].values()))
    assert run(reserved)["preemptions"]["count"] == 0 and run(packed)["preemptions"]["count"] > 0
    assert sim_main(base[:4] + ["vllm"] + base[5:] + ["--capacity-scheduler", "max_utilization"]) == 2
