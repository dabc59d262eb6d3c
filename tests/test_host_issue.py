"""vLLM's block-fp8 linear as AIConfigurator's Blackwell tables time it: a call the host issues outside a CUDA
graph, so a small GEMM takes the host's issue time (cost/engine_kernels/gemm.py `host_issue_s`, issue 20)."""
import json
from pathlib import Path

import numpy as np
import pytest

from cost.engine_kernels import GemmParams, host_issue_s
from cost.kernel_rows import gemm_rows_time, parse_row, price_rows
from cost.profile import load_profile

SAMPLES = Path(__file__).parent / "data" / "kernel_tables"
BLACKWELL_VLLM = {"gb200": "gb200", "gb300": "gb300", "b200_sxm": "b200", "b300_sxm": "b300"}


def test_host_issue_time_follows_vllms_deepgemm_dispatch():
    p = GemmParams(host_us=200.0, host_unaligned_us=100.0)
    m, n, k = np.array([8, 9, 9, 9]), np.array([1024, 1024, 1000, 1024]), np.array([1024, 1024, 1024, 1000])
    # DeepGEMM (n % 64, k % 128) pads the scales of an M that is not a multiple of 4; CUTLASS does not
    assert np.allclose(host_issue_s(p, m, n, k) * 1e6, [200.0, 300.0, 200.0, 200.0])
    assert np.all(host_issue_s(GemmParams(), m, n, k) == 0.0)   # tables that time graph replays: no floor


def _block_fp8_rows(system):
    objs = [json.loads(line) for line in (SAMPLES / f"{system}_vllm.jsonl").read_text().splitlines()]
    # GEMMs under 0.1 TFLOP: a few to tens of us on the GPU
    objs = [o for o in objs if o["op"] == "gemm" and o["dtype"] == "fp8_block" and 2 * o["m"] * o["n"] * o["k"] < 1e11]
    return [parse_row(o, i) for i, o in enumerate(objs, 1)], np.array([o["measured_ms"] * 1e-3 for o in objs])


@pytest.mark.parametrize("system", sorted(BLACKWELL_VLLM))
def test_small_block_fp8_gemms_take_the_tables_host_floor_but_not_in_a_model_step(system):
    hw = load_profile(BLACKWELL_VLLM[system])
    cal = hw.engine("vllm")
    rows, measured = _block_fp8_rows(system)   # held-out rows: 150-600 us each
    assert len(rows) >= 3
    err = np.abs(price_rows(cal, hw, rows) / measured - 1.0)
    assert np.median(err) < 0.2, err
    m, n, k = (np.array([getattr(r, a) for r in rows]) for a in "mnk")
    step = gemm_rows_time(cal, hw, "fp8_block", m, n, k, True, model_step=True).seconds
    assert np.all(step < 0.5 * measured), step / measured   # a CUDA graph replay hides the host's time


def test_the_fit_recovers_a_host_floor_and_refits_only_the_format_named():
    from dataclasses import replace

    from cost.calibrate_engine import calibrate
    from cost.kernel_db import KernelTable
    from cost.kernel_rows import GemmRow
    hw = load_profile("b200")
    base = hw.engine("vllm")
    truth = replace(base.gemm["fp8_block"], host_us=250.0, host_unaligned_us=100.0)
    rng = np.random.default_rng(0)
    shapes = [(int(m), int(n), int(k)) for m, n, k in zip(rng.choice([1, 3, 8, 17, 64, 129, 512, 2048, 8192], 160),
                                                         rng.choice([96, 1024, 4096, 7168, 16384], 160),
                                                         rng.choice([64, 512, 2048, 7168], 160))]
    rows = [GemmRow(m, n, k, "fp8_block") for m, n, k in shapes] + [GemmRow(m, n, k, "fp8") for m, n, k in shapes]
    m, n, k = (np.array([s[i] for s in shapes]) for i in range(3))
    block = gemm_rows_time(base, hw, "fp8_block", m, n, k, False, params=truth).seconds
    fp8 = gemm_rows_time(base, hw, "fp8", m, n, k, False).seconds * 1.3   # what a refit of fp8 would move
    tables = {"gemm": KernelTable("gemm", "synthetic", rows, np.concatenate([block, fp8]))}
    cal = calibrate(tables, hw, "vllm", "test fit", fraction=0.7, base=replace(base, gemm={
        **base.gemm, "fp8_block": replace(base.gemm["fp8_block"], host_us=0.0)}), only={"gemm/fp8_block"})
    assert cal.gemm["fp8"] == base.gemm["fp8"]                    # not named: kept
    fitted = cal.gemm["fp8_block"]
    assert abs(fitted.host_us - 250.0) < 25.0 and abs(fitted.host_unaligned_us - 100.0) < 25.0, fitted


def test_one_row_fp8_calls_cost_more_on_blackwell_only():
    """vLLM's per-tensor fp8 GEMM at m = 1 takes ~13-15 us more than at m = 2 on every Blackwell part, on x86 and
    Grace hosts alike (GemmParams.one_row_us); H100 shows none."""
    objs = [json.loads(line) for line in (SAMPLES / "vllm_fp8_one_row.jsonl").read_text().splitlines()]
    for system in ("b200_sxm", "gb200", "b300_sxm", "gb300", "h100_sxm"):
        hw = load_profile(BLACKWELL_VLLM.get(system, "h100"))
        cal = hw.engine("vllm")
        mine = [o for o in objs if o["system"] == system]
        rows = [parse_row({k: o[k] for k in ("op", "m", "n", "k", "dtype")}, i) for i, o in enumerate(mine, 1)]
        measured = np.array([o["measured_ms"] * 1e-3 for o in mine])
        predicted = price_rows(cal, hw, rows)
        one = np.array([o["m"] == 1 for o in mine])
        assert np.median(np.abs(predicted[one] / measured[one] - 1)) < 0.2, (system, predicted[one] / measured[one])
        extra = np.median((measured[one] - measured[~one]) * 1e6)
        assert (extra > 8.0) == (system != "h100_sxm") and (cal.gemm["fp8"].one_row_us > 8.0) == (extra > 8.0)
