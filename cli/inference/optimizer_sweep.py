"""Many throughput_optimizer searches: every model x device x load, in a process pool.

    python -m cli.inference.optimizer_sweep --models M1,M2 --devices D1,D2 [--request-rates R1,R2] [--jobs N]
        -- <throughput_optimizer flags: --num-devices, --input-length, --output-length, limits, ...>

Each point is one throughput_optimizer search with the flags after `--`, its MODEL, --device and (when given)
--request-rate set by the sweep; each prints one JSON line, in the order of the points: the point, and the best
candidate (as `--json` gives it) or the one-line error that search gave. Points run in a concurrent.futures
process pool, or in Ray's multiprocessing Pool when ray is installed (it spreads over a Ray cluster); the points of
one model run next to each other, so a worker prices them from the traces it already holds.
"""
from __future__ import annotations

import argparse
import io
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from contextlib import redirect_stderr, redirect_stdout

from ..common import ArgumentParser, WorkLimit, quiet_broken_pipe
from .config import InputError

MAX_POINTS = WorkLimit("TRACECOST_MAX_SWEEP_POINTS", 10**6, "optimizer searches in one sweep")


def _names(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give a comma list")
    return names


def _rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in _names(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be numbers, got '{text}'") from None
    return rates


def search(argv: list[str]) -> dict:
    """One throughput_optimizer search, in this process: {"best": ...} or {"error": its one-line message}."""
    from . import throughput_optimizer
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = throughput_optimizer.main([*argv, "--json"])
    if rc != 0:
        lines = [x for x in err.getvalue().splitlines() if x.startswith("error:")]
        return {"error": (lines[-1] if lines else f"exit {rc}").removeprefix("error: ")}
    return {"best": json.loads(out.getvalue())["best"] or None}


def _pool(jobs: int):
    """Ray's Pool when ray is installed, else a local process pool: either maps in order, in chunks."""
    try:
        from ray.util.multiprocessing import Pool
    except ImportError:
        return ProcessPoolExecutor(jobs)
    return Pool(jobs)


def sweep(points: list[tuple[dict, list[str]]], jobs: int = 1):
    """(point, result) for each (point, optimizer argv), in order."""
    argvs = [argv for _, argv in points]
    if jobs <= 1 or len(points) <= 1:
        results = map(search, argvs)
        yield from zip((p for p, _ in points), results)
        return
    with _pool(jobs) as pool:
        chunk = max(1, min(16, len(points) // (4 * jobs)))
        yield from zip((p for p, _ in points), pool.map(search, argvs, chunksize=chunk))


@quiet_broken_pipe
def main(argv=None) -> int:
    p = ArgumentParser(prog="optimizer-sweep", description=__doc__.split("\n")[0])
    p.add_argument("--models", type=_names, required=True, help="comma list of models")
    p.add_argument("--devices", type=_names, required=True, help="comma list of device profiles")
    p.add_argument("--request-rates", type=_rates, default=None,
                   help="comma list of open-loop rates (default: each layout's best rate within the limits)")
    p.add_argument("--jobs", type=int, default=1, help="searches run at once in worker processes (default 1)")
    p.add_argument("optimizer", nargs=argparse.REMAINDER, help="-- then throughput_optimizer's flags")
    args = p.parse_args(argv)
    rest = args.optimizer[1:] if args.optimizer[:1] == ["--"] else args.optimizer
    if not 1 <= args.jobs <= 256:
        p.error("--jobs must be in [1, 256]")
    for flag in ("--device", "--request-rate"):
        if flag in rest:
            p.error(f"{flag} is set by the sweep: give --devices / --request-rates instead")
    rates = args.request_rates or [None]
    count = len(args.models) * len(args.devices) * len(rates)
    try:
        MAX_POINTS.check(count, "models x devices x rates")
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    points = [({"model": m, "device": d, "request_rate": r},
               [m, "--device", d, *rest, *(["--request-rate", repr(r)] if r is not None else [])])
              for m in args.models for d in args.devices for r in rates]
    for point, result in sweep(points, args.jobs):
        print(json.dumps({**point, **result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
