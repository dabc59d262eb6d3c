"""Prediction vs measurement for every scenario of a measurement set (default: the H200 calibration set).

    python bench/accuracy.py [../shared/measurements/h200] [--device h200] [--markdown]

Prints per scenario the predicted and measured GEMM, attention and eager total kernel time, then
the median and max absolute % error per class and phase.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cost.calibrate import load_scenarios, predict_ms  # noqa: E402
from cli.progress import Progress  # noqa: E402
from cost.profile import load_profile  # noqa: E402
from tracer.table import format_table  # noqa: E402

CLASSES = ("gemm", "attention", "total", "wall")
LABELS = {"total": "eager total", "wall": "eager wall"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("measurements", nargs="?", default=str(Path(__file__).resolve().parent.parent.parent
                                                          / "shared" / "measurements" / "h200"))
    p.add_argument("--device", default="h200")
    p.add_argument("--markdown", action="store_true", help="tables as Markdown, for the README")
    p.add_argument("--json", action="store_true", help="per-scenario predictions and the error summary as JSON")
    args = p.parse_args(argv)
    hw = load_profile(args.device)
    scenarios = load_scenarios(Path(args.measurements))
    rows, errors, records = [], {}, []
    bar = Progress(len(scenarios), "scenarios")   # each new model is traced: minutes on a cold cache
    for s in scenarios:
        pred = predict_ms(s, hw)
        bar.update()
        records.append({"model": s.model, "phase": s.phase, "batch": s.batch, "query": s.query, "context": s.context,
                        "predicted_ms": {c: pred[c] for c in CLASSES},
                        "measured_ms": {c: s.measured_ms[c] for c in CLASSES}})
        row = [s.model, s.phase, s.batch, s.query, s.context]
        for c in CLASSES:
            err = (pred[c] / s.measured_ms[c] - 1) * 100
            errors.setdefault((c, s.phase), []).append(abs(err))
            row += [f"{pred[c]:.2f}", f"{s.measured_ms[c]:.2f}", f"{err:+.1f}%"]
        rows.append(row)
    headers = ["model", "phase", "batch", "query", "context"]
    for c in CLASSES:
        label = LABELS.get(c, c)
        headers += [f"{label} pred ms", "meas ms", "err"]
    summary = []
    for c in CLASSES:
        for phase in ("prefill", "decode"):
            e = errors.get((c, phase), [])
            if e:
                summary.append([LABELS.get(c, c), phase, len(e), statistics.median(e), max(e)])
        allc = errors.get((c, "prefill"), []) + errors.get((c, "decode"), [])
        summary.append([LABELS.get(c, c), "all", len(allc), statistics.median(allc), max(allc)])
    sheaders = ["class", "phase", "scenarios", "median abs err", "max abs err"]
    bar.close()
    if args.json:
        print(json.dumps({"device": hw.name, "scenarios": records,
                          "summary": [dict(zip(("class", "phase", "scenarios", "median_abs_err_pct",
                                                "max_abs_err_pct"), r)) for r in summary]}, indent=1))
        return 0
    summary = [r[:3] + [f"{r[3]:.1f}%", f"{r[4]:.1f}%"] for r in summary]
    if args.markdown:
        def md(h, r):
            return "\n".join(["| " + " | ".join(map(str, h)) + " |", "|" + "---|" * len(h)] +
                             ["| " + " | ".join(map(str, x)) + " |" for x in r])
        print(md(sheaders, summary))
        print()
        print(md(headers, rows))
    else:
        print(format_table(headers, rows, title=f"{hw.name}: predicted vs measured kernel time ({args.measurements})"))
        print()
        print(format_table(sheaders, summary, title="absolute % error"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
