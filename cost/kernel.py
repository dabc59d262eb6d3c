"""python -m cost.kernel --device D [--engine E] --jsonl ROWS: predict kernel times for your own benchmarks.

ROWS is a file (or - for stdin) with one JSON object per line; each is written back with "ms" added:

    {"op":"gemm","m":..,"n":..,"k":..,"dtype":"bf16|fp8|fp8_block|nvfp4|mxfp4|int4",
     "role":"linear|router|lm_head|mla_absorbed"}     (run as the engine runs them: cost/op_formats.py)
    {"op":"attention","phase":"prefill|decode","batch":..,"query":..,"context":..,"heads":..,"kv_heads":..,
     "head_dim":..,"window":0,"kv_dtype":"bf16|fp8"}             (decode: query 1 over context + 1 keys)
    {"op":"moe","tokens":..,"hidden":..,"inter":..,"experts":..,"top_k":..,"tp":1,"ep":1,"dtype":..,
     "distribution":"balanced|power_law_1.2|random","gated":true}
                   (gated: gate + up + down GEMMs, SwiGLU, the default; false: up + down, relu^2 as Nemotron-H)
    {"op":"allreduce","bytes":..,"gpus":..,"impl":"nccl|custom"}

Each timed region is what the published kernel tables time (cost/kernel_rows.py says exactly what). Each row
also gets "kernel_model", the profile's fitted model that priced it (decode_attention.bf16_mha: TensorRT-LLM's
multi-head decode kernel; gemm.bf16 (weight-only): an fp8 GEMM on a GPU without fp8), and "carried_over" and
"kernels_fitted_on": whether the device's kernel models were fitted on its own tables, and on which device's they
were; a carried-over device is named first on stderr. A model this device takes from another fit (its profile's
`carried` formats, or another engine's fit of this device) also gets "kernel_model_from", naming where.
A bad row stops with an error naming its line number; nothing is written for it.
"""
from __future__ import annotations

import argparse
import sys

from tracer.cli_io import dumps_strict, json_lines, quiet_broken_pipe

from .engines import DEFAULT_ENGINE, ENGINES
from .kernel_rows import RowError, parse_row, price_rows_traced
from .profile import ProfileError, load_profile
from .provenance import kernel_origin


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def read_rows(stream) -> tuple[list[dict], list]:
    objects, rows = [], []
    for line_no, obj in json_lines(stream, None, RowError):
        rows.append(parse_row(obj, line_no))
        objects.append(obj)
    return objects, rows


@quiet_broken_pipe
def main(argv=None) -> int:
    p = _Parser(prog="python -m cost.kernel", description=__doc__.split("\n")[0])
    p.add_argument("--device", required=True, help="hardware profile name/alias or .json path")
    p.add_argument("--engine", default=DEFAULT_ENGINE, choices=list(ENGINES),
                   help=f"serving engine whose fitted kernel models price the rows (default {DEFAULT_ENGINE})")
    p.add_argument("--jsonl", required=True, metavar="ROWS", help="rows file, or - for stdin")
    args = p.parse_args(argv)
    try:
        hw = load_profile(args.device)
        cal = hw.engine(args.engine)
        if args.jsonl == "-":
            objects, rows = read_rows(sys.stdin)
        else:
            with open(args.jsonl, encoding="utf-8") as f:
                objects, rows = read_rows(f)
        seconds, models = price_rows_traced(cal, hw, rows) if rows else ([], [])
    except (RowError, ProfileError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (OSError, UnicodeDecodeError) as e:
        print(f"error: cannot read {args.jsonl}: {e}", file=sys.stderr)
        return 2
    origin = kernel_origin(hw, args.engine)
    if origin.headline():     # said first, before any number
        print(origin.headline(), file=sys.stderr)
    taken = cal.inherited
    for obj, s, model in zip(objects, seconds, models):
        base = model.split(" ")[0]
        print(dumps_strict({**obj, "ms": round(float(s) * 1e3, 6), "kernel_model": model,
                            "carried_over": origin.carried_over, "kernels_fitted_on": origin.fitted_on,
                            **({"kernel_model_from": taken[base]} if base in taken else {})}))
    print(f"{len(rows)} rows priced with {ENGINES[args.engine].label} kernels on {hw.name} ({cal.origin})",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
