"""Write small samples of the kernel tables (held-out rows only) for the tests: tests/data/kernel_tables/.

    python bench/sample_kernel_rows.py --kernel-db aiconfigurator_core-0.12.0-*.whl [--engine vllm]
        [--systems h100_sxm,...] [--per-group 6]

Each output line is a `python -m cost.kernel` row plus "measured_ms" and "source" (the table file).
The tests check the bundled profiles against them, so CI never needs the 81 MB wheel.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cli.common import positive_int, run_main  # noqa: E402
from cost.calibrate_engine import SYSTEM_PROFILES, split, system_list  # noqa: E402
from cost.engines import DEFAULT_ENGINE, ENGINES  # noqa: E402
from cost.kernel_db import load_tables  # noqa: E402
from cost.kernel_rows import ROW_TYPES, group_key  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "kernel_tables"


def row_json(row) -> dict:
    op = next(name for name, cls in ROW_TYPES.items() if isinstance(row, cls))
    defaults = {f.name: f.default for f in fields(row)}
    return {"op": op, **{k: v for k, v in asdict(row).items() if k not in defaults or v != defaults[k]
                         or k in ("dtype", "kv_dtype", "impl", "phase")}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kernel-db", required=True)
    p.add_argument("--engine", default=DEFAULT_ENGINE, choices=list(ENGINES))
    p.add_argument("--systems", type=system_list, default=list(SYSTEM_PROFILES),
                   help="comma-separated (default: every fitted one)")
    p.add_argument("--per-group", type=positive_int, default=6)
    p.add_argument("--seed", type=int, default=0)
    return run_main(write_samples, p.parse_args(argv))   # tables that cannot be read: one line, exit 2


def write_samples(args) -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    for system in args.systems:
        lines = []
        for name, t in load_tables(args.kernel_db, system, args.engine).items():
            if name == "quant":
                continue
            held = ~split(len(t.rows), args.seed)
            groups: dict = {}
            for i, row in enumerate(t.rows):
                if held[i]:
                    groups.setdefault(group_key(row, args.engine), []).append(i)
            for index in groups.values():
                for i in sorted(rng.choice(index, min(args.per_group, len(index)), replace=False)):
                    lines.append(json.dumps({**row_json(t.rows[i]), "measured_ms": round(float(t.seconds[i]) * 1e3, 6),
                                             "source": t.source.split("systems/data/")[-1]}))
        path = OUT / f"{system}_{args.engine}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        print(f"wrote {path} ({len(lines)} rows)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
