"""vLLM's per-tensor fp8 GEMM at m = 1 against m = 2-16: the tables' one-row cost and how well the profiles price it.

    python bench/one_row_gemm.py --kernel-db WHEEL_OR_DIR [--systems b200_sxm,gb200,b300_sxm,gb300,h100_sxm]

For each system: the median of t(m = 1) - t(m = 2) over the shapes timed at both, and the median |error| (signed) of
the bundled profile on every third m = 1 and m = 2-16 row (cost/engine_kernels/gemm.py `GemmParams.one_row_us`).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cost.kernel_db import KernelDBError, load_tables  # noqa: E402
from cost.kernel_rows import price_rows  # noqa: E402
from cost.profile import load_profile  # noqa: E402

PROFILES = {"b200_sxm": "b200", "gb200": "gb200", "b300_sxm": "b300", "gb300": "gb300", "h100_sxm": "h100",
            "h200_sxm": "h200"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kernel-db", required=True, help="the aiconfigurator-core wheel or its unzipped folder")
    p.add_argument("--systems", default="b200_sxm,gb200,b300_sxm,gb300,h100_sxm")
    args = p.parse_args(argv)
    print("| system | m=1 - m=2, median us | m = 1 rows | m = 1 median abs (signed) | m = 2-16 median abs (signed) |")
    print("|---|---|---|---|---|")
    for system in args.systems.split(","):
        try:
            table = load_tables(args.kernel_db, system, "vllm").get("gemm")
        except KernelDBError:
            table = None
        if table is None or system not in PROFILES:
            print(f"| {system} | no vLLM GEMM table or profile | | | |")
            continue
        times = {(r.m, r.n, r.k): t for r, t in zip(table.rows, table.seconds) if r.dtype == "fp8"}
        extra = statistics.median((times[(1, n, k)] - times[(2, n, k)]) * 1e6 for (m, n, k) in times
                                  if m == 1 and (2, n, k) in times)
        hw = load_profile(PROFILES[system])
        fp8 = {(r.m, r.n, r.k): r for r in table.rows if r.dtype == "fp8"}
        cells = []
        for chosen in (lambda m: m == 1, lambda m: 2 <= m <= 16):
            shapes = sorted(s for s in times if chosen(s[0]))[::3]
            predicted = price_rows(hw.engine("vllm"), hw, [fp8[s] for s in shapes])
            errs = [float(pred) / times[s] - 1 for pred, s in zip(predicted, shapes)]
            cells.append((len(shapes), statistics.median(abs(e) for e in errs), statistics.median(errs)))
        print(f"| {system} | {extra:.1f} | {cells[0][0]} | {cells[0][1]:.1%} ({cells[0][2]:+.1%}) | "
              f"{cells[1][1]:.1%} ({cells[1][2]:+.1%}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
