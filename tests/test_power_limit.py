"""Power-limited parts (cost/power.py): a profile's power_limit scales dense matrix work by its sustained clock,
bad values are refused at load, and PCIe cards without NVLink bridges price their all-reduce on PCIe."""
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from cost.estimate import engine_allreduce_seconds
from cost.kernel_rows import parse_row, price_rows
from cost.profile import ProfileError, load_profile, parse_profile, profiles_dir
from serving.calibrate_serving import main as from_serving
from serving.measurements import MAX, RATE, load_file, system_device
from serving.published import map_row

ROOT = Path(__file__).resolve().parents[1]


def _gemm_ms(hw, m: int, n: int, k: int, dtype: str = "bf16") -> float:
    row = parse_row({"op": "gemm", "m": m, "n": n, "k": k, "dtype": dtype}, 1)
    return float(price_rows(hw.engine("trtllm"), hw, [row])[0])


@pytest.mark.parametrize("device", ["h100nvl", "h100pcie"])
def test_capped_part_prices_a_large_gemm_slower_by_its_clock(device):
    capped = load_profile(device)
    assert 0.5 <= capped.matrix_clock < 1.0 and capped.board_w < 700
    uncapped = replace(capped, matrix_clock=1.0, path=f"{capped.path}#uncapped")
    # compute-bound and long (the donor fit's boost window, ~0.4 ms at its start, is a fixed time; bf16: no
    # activation quantization kernel, which streams memory): the clock's share
    big = _gemm_ms(capped, 32768, 32768, 16384) / _gemm_ms(uncapped, 32768, 32768, 16384)
    assert big == pytest.approx(1.0 / capped.matrix_clock, rel=0.03)
    gemv = _gemm_ms(capped, 1, 8192, 8192) / _gemm_ms(uncapped, 1, 8192, 8192)
    assert gemv < 1.05                                                     # weight streaming keeps its speed
    # the peak every matrix model reads is the datasheet's at that clock
    assert capped.matrix_peak("bf16") == pytest.approx(capped.matrix_tflops["bf16"] * 1e12 * capped.matrix_clock)


def test_geforce_part_runs_dense_matrix_work_above_its_donors_clock():
    """An RTX 4090 carries the L40S's kernel models; its half-rate FP32-accumulate tensor cores keep their clock under
    450 W where the L40S's fall under 350 W, so a long compute-bound GEMM runs at the 4090's measured rate."""
    geforce = load_profile("rtx4090")
    assert geforce.matrix_clock > 1.0 and geforce.board_w == 450 and "not fitted on serving runs" in geforce.power_origin
    m = n = k = 4096
    row = parse_row({"op": "gemm", "m": m, "n": n, "k": k, "dtype": "bf16"}, 1)
    achieved = 2 * m * n * k / float(price_rows(geforce.engine("vllm"), geforce, [row])[0]) / 1e12     # TFLOPS
    # the measurement the number comes from: 166.3 TFLOPS at this shape (tinygrad PR #6926), against the 165.2 of
    # the datasheet; the L40S fit it carries prices the same shape at ~0.61 of the L40S's datasheet
    assert achieved == pytest.approx(166.3, rel=0.01)
    donor = load_profile("l40s")
    donor_share = 2 * m * n * k / float(price_rows(donor.engine("vllm"), donor, [row])[0]) / 1e12 \
        / donor.matrix_tflops["bf16"]
    assert donor_share < 0.7 < achieved / geforce.matrix_tflops["bf16"]
    gemv = _gemm_ms(geforce, 1, 8192, 8192) / _gemm_ms(replace(geforce, matrix_clock=1.0, path="x"), 1, 8192, 8192)
    assert gemv > 0.95                                                      # weight streaming is memory's
    capped = load_profile("rtx4090@300W")
    assert capped.matrix_clock == pytest.approx(geforce.matrix_clock * 300 / 450)
    assert "binds its dense matrix work less" in capped.power_origin


def test_power_limit_is_said_in_the_origin_and_notes():
    from cost.provenance import kernel_origin
    origin = kernel_origin(load_profile("h100nvl"), "vllm")
    assert origin.power and "0.576 of the datasheet clock" in origin.power and "400 W" in origin.power
    assert origin.as_json()["power_limit"] == origin.power and origin.power in origin.notes()
    assert kernel_origin(load_profile("h100"), "vllm").power is None


def _profile(name: str) -> dict:
    return json.loads((profiles_dir() / f"{name}.json").read_text())


@pytest.mark.parametrize("change, error", [
    ({"matrix_clock": 2.5}, "power_limit.matrix_clock': must be less than or equal to 2"),
    ({"matrix_clock": 0.3}, "power_limit.matrix_clock': must be greater than or equal to 0.5"),
    ({"matrix_clock": float("nan")}, "power_limit.matrix_clock'"),
    ({"matrix_clock": "0.7"}, "power_limit.matrix_clock'"),
    ({"board_w": 0}, "power_limit.board_w': must be greater than 0"),
    ({"origin": ""}, "power_limit.origin'"),
    ({"watts": 300}, "power_limit.watts': unknown field"),
])
def test_bad_power_limit_is_refused_at_load(change, error):
    data = _profile("h100nvl")
    data["power_limit"].update(change)
    with pytest.raises(ProfileError, match=error.replace("(", r"\(")):
        parse_profile(data, "bad", "bad.json")


def test_power_limit_on_a_device_with_its_own_fits_is_refused():
    """L40S's engine kernels were fitted on its own tables, which ran at its own 350 W limit."""
    data = _profile("l40s")
    data["power_limit"] = {"board_w": 350, "reference_board_w": 700, "matrix_clock": 0.8, "origin": "test"}
    with pytest.raises(ProfileError, match="power_limit.*fitted on this device's own tables"):
        parse_profile(data, "l40s-bad", "l40s-bad.json")


def test_cli_refuses_a_bad_power_limit_in_one_line(tmp_path):
    data = _profile("h100nvl")
    data["power_limit"]["matrix_clock"] = 2.5
    path = tmp_path / "nvl.json"
    path.write_text(json.dumps(data))
    done = subprocess.run([sys.executable, "-m", "cli.inference.text_generate", "llama-3.2-1b", "--device", str(path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().count("\n") == 0 and "power_limit.matrix_clock" in done.stderr


def test_unbridged_pair_all_reduces_over_pcie():
    bridged, pcie = load_profile("h100nvl"), load_profile("h100nvl:pcie")
    assert pcie.pcie_only and pcie.scale_up_gpus == 8 and pcie.matrix_clock == bridged.matrix_clock
    message = 1300 * 8192 * 2      # a decode step's hidden states at MLPerf's batch, fp16
    slow = engine_allreduce_seconds(message, 2, pcie, "trtllm")
    fast = engine_allreduce_seconds(message, 2, bridged, "trtllm")
    assert slow / fast > 5          # ~40 GB/s of PCIe Gen5 bus bandwidth against NVLink's hundreds


def test_mlperf_systems_without_bridges_map_to_the_pcie_topology():
    source = "mlcommons/inference_results_v4.1 closed/ASUSTeK/results/ESC8000A_E12_H100x8_TRT/llama2-70b-99/x"
    assert system_device("h100pcie", source) == "h100pcie:pcie"
    assert system_device("h100nvl", "closed/HPE/results/HPE_ProLiant_DL380a_H100_NVL_94GBx4_TRT/x") == "h100nvl"
    row = {"id": "t-Offline", "source": source, "source_kind": "mlperf_inference_v4.1", "engine": "TensorRT-LLM",
           "model": "meta-llama/Llama-2-70b-chat-hf", "precision": "fp8", "kv_cache_dtype": "fp8",
           "gpu": "H100-PCIe-80GB", "num_gpus": 8, "tp": 2, "dp": 4, "isl": 222.3, "osl": 291.0,
           "mode": "offline_max_throughput", "num_requests": 400, "output_tok_s": 9000.0}
    run, why = map_row(row)
    assert why is None and run.device == "h100pcie:pcie" and run.replicas == 4


def test_devset_rows_are_one_replica(tmp_path):
    """--from-serving fits one engine: a row on 8 GPUs at TP2 ran 4 replicas, each with a quarter of the load."""
    rows = [{"id": "r-Offline", "source_kind": "mlperf_inference_v4.1", "engine": "TensorRT-LLM",
             "gpu": "H100-NVL-94GB", "model": "meta-llama/Llama-2-70b-chat-hf", "precision": "fp8", "num_gpus": 8,
             "tp": 2, "dp": 4, "isl": 222.3, "osl": 290.0, "mode": "offline_max_throughput", "num_requests": 400,
             "output_tok_s": 8000.0, "dataset": "MLPerf llama2-70b OpenOrca subset"},
            {"id": "r-Server", "source_kind": "mlperf_inference_v4.1", "engine": "TensorRT-LLM",
             "gpu": "H100-NVL-94GB",
             "model": "meta-llama/Llama-2-70b-chat-hf", "precision": "fp8", "num_gpus": 4, "tp": 1, "dp": 4,
             "isl": 222.3, "osl": 290.0, "mode": "online_request_rate", "request_rate": 20.0, "output_tok_s": 5800.0,
             "ttft_ms": {"mean": 200.0}}]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    offline, server = load_file(str(path))
    assert offline.load == MAX and offline.load_value == 100 and offline.measured["output_tok_s"] == 2000.0
    assert offline.lengths == "mlperf-llama2-70b"
    assert server.load == RATE and server.load_value == 5.0 and server.measured == {"ttft_ms": 200.0,
                                                                                    "output_tok_s": 1450.0}


def test_a_device_with_its_own_tables_keeps_them_under_fit_power(capsys):
    """On a device fitted on its own tables --fit-power finds the cluster's equivalent cap; the tables stay."""
    data = str(ROOT / "tests" / "data" / "serving_inputs" / "mi300x_vllm066_rows.jsonl")
    assert from_serving([data, "--device", "l40s", "--engine", "vllm", "--fit-power", "--overheads", "none",
                         "--write-profile"]) == 2
    assert "l40s's kernel models are fitted on its own tables and stay" in capsys.readouterr().err


def test_fit_power_finds_the_cap_of_a_cluster_slower_than_the_tables():
    """A cluster of H100 SXMs held at 400 W, measured: the fit over PowerLimit on h100's own tables finds the clock
    the cap law gives 400 W, and reports the device to price the cluster with."""
    from serving.calibrate_report import equivalent_cap
    from serving.calibrate_serving import Fit, ServingModel
    from serving.measurements import BATCH, MAX, ServingMeasurement
    from cost.engines import ServingOverheads
    from cost.power import PowerLimit
    base, overheads = load_profile("h100"), ServingOverheads()
    truth = ServingModel(load_profile("h100@400W"), overheads)
    runs = []
    for i, (load, value, isl, osl) in enumerate([(BATCH, 64, 2048, 64), (BATCH, 1, 128, 128), (MAX, 256, 1024, 128)]):
        m = ServingMeasurement(f"run{i}", "synthetic", "test", "llama-3.2-1b", "h100", "vllm", "", "bf16", None, 1,
                               isl, osl, load, value)
        metric = "e2e_latency_ms" if load == BATCH else "output_tok_s"
        runs.append(replace(m, measured={metric: truth.predict(m)[metric]}))
    fit = Fit(base, "vllm", runs, [], overheads, True, log=lambda _: None, device_set=PowerLimit)
    values, std, mse = fit.run()
    assert mse < 1e-4 and values[0] == pytest.approx(400 / 700, abs=0.02)
    (line,) = equivalent_cap(base, float(values[0]), float(std[0]))
    assert "--device h100@4" in line and "of its 700 W" in line
    assert "no power cap explains" in equivalent_cap(base, 1.2, 0.01)[0]


def test_fit_power_recovers_a_known_clock():
    """--fit-power's fit (serving/calibrate_serving.py Fit over PowerLimit) finds the clock that made the runs."""
    from serving.calibrate_serving import Fit, ServingModel, with_scaling
    from serving.measurements import BATCH, ServingMeasurement
    from cost.engines import ServingOverheads
    from cost.power import PowerLimit
    base = with_scaling(load_profile("h100nvl"), PowerLimit(), "#test-base")
    overheads = ServingOverheads()
    truth = ServingModel(with_scaling(base, PowerLimit(matrix_clock=0.7), "#test-truth"), overheads)
    runs = []
    for i, (load, value, isl, osl) in enumerate([(BATCH, 64, 1024, 64), (BATCH, 8, 2048, 32), (MAX, 256, 512, 128)]):
        m = ServingMeasurement(f"run{i}", "synthetic", "test", "llama-3.2-1b", "h100nvl", "trtllm", "", "bf16", None,
                               1, isl, osl, load, value)
        metric = "e2e_latency_ms" if load == BATCH else "output_tok_s"
        runs.append(replace(m, measured={metric: truth.predict(m)[metric]}))
    fit = Fit(base, "trtllm", runs, [], overheads, True, log=lambda _: None, device_set=PowerLimit)
    values, std, mse = fit.run()
    assert fit.names == ["matrix_clock"] and mse < 1e-4
    assert values[0] == pytest.approx(0.7, abs=0.02)


def test_fit_power_needs_a_power_limit_section(capsys):
    data = str(ROOT / "tests" / "data" / "serving_inputs" / "mi300x_vllm066_rows.jsonl")
    assert from_serving([data, "--device", "mi300x", "--engine", "vllm", "--fit-power", "--overheads", "none"]) == 2
    assert "--fit-power: mi300x has no power_limit section" in capsys.readouterr().err


def test_power_cap_scales_the_matrix_clock_in_proportion():
    """`DEVICE@WATTSW`: a cap below the rated board power (nvidia-smi -pl, MLPerf's MaxQ) slows dense matrix work by
    the power ratio, on the profile's own clock, and says so."""
    rated, capped = load_profile("h200"), load_profile("h200@500W")
    assert rated.matrix_clock == 1.0 and rated.board_w == 700
    assert capped.matrix_clock == pytest.approx(500 / 700) and capped.board_w == 500 and capped.key == "h200@500W"
    assert "capped at 500 W of its 700 W" in capped.power_note
    nvl = load_profile("h100nvl@350W")         # a fitted limit capped further
    assert nvl.matrix_clock == pytest.approx(load_profile("h100nvl").matrix_clock * 350 / 400)
    both = load_profile("h100:hgx4@600W")      # a topology and a cap
    assert both.topology == "hgx4" and both.matrix_clock == pytest.approx(600 / 700)
    big = _gemm_ms(capped, 32768, 32768, 16384) / _gemm_ms(rated, 32768, 32768, 16384)
    assert big == pytest.approx(700 / 500, rel=0.03)
    assert _gemm_ms(capped, 1, 8192, 8192) / _gemm_ms(rated, 1, 8192, 8192) < 1.05


@pytest.mark.parametrize("device, error", [
    ("h200@200W", "a 200 W cap on NVIDIA H200 SXM: give 350-700 W"),
    ("h200@900W", "a 900 W cap on NVIDIA H200 SXM: give 350-700 W"),
    ("h20@300W", "states no board power"),
    ("h200@500", "a board power cap is written DEVICE"),
    ("h200@500W@400W", "a board power cap is written DEVICE"),
    ("h200@abcW", "a board power cap is written DEVICE"),
])
def test_power_cap_outside_the_law_is_refused(device, error):
    with pytest.raises(ProfileError, match=error):
        load_profile(device)


def test_mlperf_maxq_rows_carry_their_stated_power_limit():
    row = {"id": "t-Offline", "source": "closed/NVIDIA/results/H200-SXM-141GBx8_TRT_MaxQ/llama2-70b-99/x",
           "source_kind": "mlperf_inference_v4.1", "engine": "TensorRT-LLM", "model": "meta-llama/Llama-2-70b-chat-hf",
           "precision": "fp8", "kv_cache_dtype": "fp8", "gpu": "H200-SXM-141GB", "num_gpus": 8, "tp": 1, "dp": 8,
           "isl": 222.3, "osl": 291.0, "mode": "offline_max_throughput", "num_requests": 400, "output_tok_s": 25000.0,
           "engine_flags": "gpu_batch_size={'llama2-70b': 806}; max_num_tokens=4096; power_limit=500; use_fp8=True"}
    run, why = map_row(row)
    assert why is None and run.device == "h200@500W" and run.max_num_seqs == 806


def test_hgx_4gpu_boards_pair_over_six_links():
    """A 4-GPU HGX H100 board joins each pair with 6 of 18 NVLinks: a TP2 all-reduce of a large message takes ~3x
    the NVSwitch board's; 4 GPUs use every link and keep the measured curves."""
    switch, mesh = load_profile("h100"), load_profile("h100:hgx4")
    assert mesh.scale_up_gpus == 4 and mesh.interconnect_bandwidth_gbps == 150
    message = 1400 * 8192 * 2
    ratio = engine_allreduce_seconds(message, 2, mesh, "trtllm") / engine_allreduce_seconds(message, 2, switch, "trtllm")
    assert 2.0 < ratio < 3.0            # the bandwidth term x3, the fitted latency and ramp kept
    assert engine_allreduce_seconds(message, 4, mesh, "trtllm") == engine_allreduce_seconds(message, 4, switch, "trtllm")
    source = "closed/Dell/results/XE8640_H100_SXM_80GBx4_TRT/llama2-70b-99/Offline/performance/run_1/x"
    assert system_device("h100", source) == "h100:hgx4"
    assert system_device("h100", "closed/Dell/results/XE9680_H100_SXM_80GBx8_TRT/llama2-70b-99/x") == "h100"


def test_rate_within_limits_of_a_refused_setup_is_refused():
    """A 70B model in fp16 on one 80 GB GPU holds no KV cache: no rate meets the limits, and that is a refusal, not
    a rate of 0."""
    from serving.published import Predictor, rate_within_limits
    row = {"id": "t-Server", "source_kind": "mlperf_inference_v4.1", "engine": "TensorRT-LLM",
           "model": "meta-llama/Llama-2-70b-chat-hf", "precision": "fp16", "gpu": "H100-SXM-80GB", "num_gpus": 1,
           "tp": 1, "isl": 222.3, "osl": 291.0, "mode": "online_request_rate", "request_rate": 5.0,
           "output_tok_s": 1000.0, "ttft_ms": {"mean": 300.0}}
    run, why = map_row(row)
    assert why is None and run.latency_limits
    with pytest.raises(ValueError, match="the KV cache holds 0 tokens"):
        rate_within_limits(Predictor(), run)


def test_one_batch_of_a_refused_setup_is_refused():
    """The same setup as one static batch (benchmark_latency.py, walked step by step) is refused too, not walked."""
    from serving.published import Predictor
    row = {"id": "t-lat", "source_kind": "rocm_vllm_devdocker_latency", "engine": "vLLM", "engine_version": "0.8.5",
           "model": "meta-llama/Llama-2-70b-chat-hf", "precision": "fp16", "gpu": "H100-SXM-80GB", "num_gpus": 1,
           "tp": 1, "isl": 128.0, "osl": 128.0, "mode": "offline_batch", "batch_size": 8,
           "e2e_latency_ms": {"mean": 5000.0}}
    run, why = map_row(row)
    assert why is None and run.mode == "offline_batch"
    with pytest.raises(ValueError, match="the KV cache holds 0 tokens"):
        Predictor().predict(run)


def test_submitters_stated_kv_format_fills_a_row_that_states_none():
    """AMD's MLPerf v4.1 code quantizes Llama-2-70B with an FP8 KV cache (closed/AMD/code/llama2-70b-99/README.md),
    on AMD's systems and on Dell's that run AMD's harness; the rows state no KV format."""
    row = {"id": "a-Offline", "source": "closed/AMD/results/8xMI300X_2xEPYC-TURIN/llama2-70b-99/Offline/x",
           "source_kind": "mlperf_inference_v4.1", "engine": "vLLM (ROCm, AMD MLPerf harness)",
           "engine_version": "vLLM 0.4.3", "model": "meta-llama/Llama-2-70b-chat-hf", "precision": "fp8",
           "gpu": "MI300X-192GB", "num_gpus": 8, "tp": 1, "dp": 8, "isl": 222.3, "osl": 291.0,
           "mode": "offline_max_throughput", "num_requests": 400, "output_tok_s": 20000.0}
    run, why = map_row(row)
    assert why is None and run.kv_dtype == "fp8"
    run, _ = map_row({**row, "kv_cache_dtype": "bf16"})       # what a row states wins
    assert run.kv_dtype == "bf16"
    run, _ = map_row({**row, "source": "closed/Dell/results/XE9680_MI300X_192GBx8/llama2-70b-99/Offline/x"})
    assert run.kv_dtype == "fp8"
    run, _ = map_row({**row, "engine": "vLLM"})                # another harness: its code says nothing here
    assert run.kv_dtype is None


def test_nvidia_harness_formats_fill_mixtral_and_a_base_precision():
    """NVIDIA's MLPerf builders quantize Mixtral and Llama-2 to FP8 weights with an FP8 KV cache and refuse
    anything else (closed/NVIDIA/code/*/tensorrt/builder.py): a partner's row that says fp16 and no KV format runs
    fp8/fp8; a row stating fp4 (B200's preview) keeps fp4."""
    row = {"id": "m-Server", "source": "closed/Dell/results/XE8640_H100_SXM_80GBx4_TRT/mixtral-8x7b/Server/x",
           "source_kind": "mlperf_inference_v4.1", "engine": "TensorRT-LLM (NVIDIA MLPerf harness)",
           "model": "mistralai/Mixtral-8x7B-Instruct-v0.1", "precision": "fp16", "gpu": "H100-SXM-80GB",
           "num_gpus": 4, "tp": 1, "dp": 4, "isl": 427.0, "osl": 146.0, "mode": "online_request_rate",
           "request_rate": 40.0, "output_tok_s": 5000.0}
    run, why = map_row(row)
    assert why is None and (run.dtype, run.kv_dtype) == ("fp8", "fp8")
    run, _ = map_row({**row, "precision": "fp4"})
    assert run.dtype == "fp4"
    run, _ = map_row({**row, "engine": "TensorRT-LLM"})        # not NVIDIA's harness: the row's own words
    assert (run.dtype, run.kv_dtype) == ("fp16", None)
    run, why = map_row({**row, "tp": None, "dp": None})        # 4 GPUs and no layout: not guessed
    assert run is None and "layout not stated" in why


def test_from_serving_prices_a_row_at_its_stated_cap(tmp_path):
    """--from-serving reads a MaxQ row's power_limit=500 as the development-set predictor does."""
    from serving.calibrate_serving import ServingModel
    row = {"id": "q-Offline", "source_kind": "mlperf_inference_v4.1", "engine": "TensorRT-LLM",
           "model": "meta-llama/Llama-3.1-8B-Instruct", "precision": "fp8", "kv_cache_dtype": "fp8",
           "gpu": "H200-SXM-141GB", "num_gpus": 1, "tp": 1, "isl": 1024.0, "osl": 128.0,
           "mode": "offline_max_throughput", "num_requests": 2000, "output_tok_s": 10000.0}
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (row, {**row, "id": "q2-Offline",
                                                             "engine_flags": "power_limit=500"})) + "\n")
    uncapped, capped = load_file(str(path))
    model = ServingModel(load_profile("h200"))
    slow, fast = model.predict(capped)["output_tok_s"], model.predict(uncapped)["output_tok_s"]
    assert slow < fast * 0.95
    assert model.cost(capped).hw.matrix_clock == pytest.approx(500 / 700)
