"""TensorRT-LLM's weight-only GEMMs (int8_wo, int4_wo) against the bf16 GEMM fit at the stored weight bytes, with and
without the weight-only kernel's terms in cost/engine_formats.json (`weight_only_kernel`: extra time per call,
streaming share, math ceiling).

    python bench/weight_only_gemm.py --kernel-db WHEEL_OR_DIR [--systems a100_sxm] [--engine trtllm]

Median and p90 |error| (signed median) per format on the held-out half (seed 0; the half the per-call cost was not
fitted on), overall and by m. The tables replay one layer, so weights are priced as they stay in L2 between replays,
as the bf16 rows are.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cost.calibrate_engine import SYSTEM_PROFILES, split  # noqa: E402
from cost.engine_pricing import weight_only_kernel  # noqa: E402
from cost.kernel_db import KernelDBError, load_weight_only_gemm  # noqa: E402
from cost.kernel_rows import gemm_rows_time  # noqa: E402
from cost.op_formats import run_format  # noqa: E402
from cost.profile import load_profile  # noqa: E402

M_BANDS = ((1, 16), (17, 256), (257, None))


def _stats(err: np.ndarray) -> str:
    a = np.abs(err)
    return f"{np.median(a) * 100:.1f}% / {np.percentile(a, 90) * 100:.1f}% ({np.median(err) * 100:+.1f}%)"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kernel-db", required=True, help="the aiconfigurator-core wheel or its unzipped folder")
    p.add_argument("--systems", default="a100_sxm")
    p.add_argument("--engine", default="trtllm")
    args = p.parse_args(argv)
    print("| system | format | held-out rows | bf16 fit at the stored bytes | with weight_only_kernel | "
          + " | ".join(f"m {lo}-{hi or ''}" for lo, hi in M_BANDS) + " |")
    print("|---" * (5 + len(M_BANDS)) + "|")
    for system in args.systems.split(","):
        try:
            table = load_weight_only_gemm(args.kernel_db, system, args.engine)
        except KernelDBError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if table is None or system not in SYSTEM_PROFILES:
            print(f"| {system} | no weight-only GEMM table | | | |")
            continue
        hw = load_profile(SYSTEM_PROFILES[system])
        cal = hw.engine(args.engine)
        held = ~split(len(table.rows), 0)
        for fmt in sorted({r.dtype for r in table.rows}):
            idx = np.flatnonzero([r.dtype == fmt and h for r, h in zip(table.rows, held)])
            m, n, k = (np.array([getattr(table.rows[i], a) for i in idx]) for a in "mnk")
            measured = table.seconds[idx]
            f = run_format(fmt, "linear", args.engine, hw, moe=False)
            plain = gemm_rows_time(cal, hw, "bf16", m, n, k, False, weight_bytes=f.weight_bytes).seconds
            bf16 = gemm_rows_time(cal, hw, "bf16", m, n, k, False, weight_bytes=f.weight_bytes / f.stream_fraction)
            priced = weight_only_kernel(bf16, f, hw, 2.0 * m * n * k).seconds
            err = priced / measured - 1.0
            bands = [_stats(err[(m >= lo) & ((m <= hi) if hi else True)]) for lo, hi in M_BANDS]
            print(f"| {system} | {fmt} | {len(idx)} | {_stats(plain / measured - 1.0)} | {_stats(err)} | "
                  + " | ".join(bands) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
