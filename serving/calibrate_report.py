"""What a serving fit (serving/calibrate_serving.py) reports and writes: the GEMM fractions a device scaling implies,
the board power cap a fitted clock is, and the calibrated profile, cap or overheads it stores."""
from __future__ import annotations

import json
import sys
from dataclasses import fields
from pathlib import Path

from cost.engines import ServingOverheads
from cost.power import POWER_CAP_LAW, PowerLimit
from cost.profile import HardwareProfile, profiles_dir


def implied_fractions(fitted_hw: HardwareProfile, rows) -> list[str]:
    """What the scaling means on this device's datasheet: the GEMM compute and memory fractions it implies."""
    out = []
    for fmt in sorted({m.dtype for m in rows}):
        cal = fitted_hw.engine(rows[0].engine)
        if fmt in cal.gemm:
            g = cal.gemm[fmt]
            peak = fitted_hw.matrix_tflops.get(fmt, 0)
            out.append(f"  {fmt} GEMMs on {fitted_hw.name}: {g.compute:.2f} of the {peak:g} TFLOPS peak, "
                       f"{g.memory:.2f} of {fitted_hw.memory_bandwidth_gbps:g} GB/s, "
                       f"{g.fixed_us:.1f} us per call")
    return out


def cap_watts(hw: HardwareProfile, matrix_clock: float) -> float:
    """The board power cap whose clock (the cap law: in proportion to the power) is `matrix_clock` of the tables'."""
    return hw.board_w * matrix_clock


def equivalent_cap(hw: HardwareProfile, matrix_clock: float, std: float | None) -> list[str]:
    if matrix_clock > 1.0:
        return [f"  this cluster's dense matrix work runs {matrix_clock:.2f}x as fast as on the machines behind "
                f"{hw.key}'s kernel tables: no power cap explains that"]
    error = f" +- {hw.board_w * std:.0f} W" if std is not None else " (at the lowest cap the law is checked at)"
    return [f"  this cluster's dense matrix work runs at {matrix_clock:.3g} of the clock behind {hw.key}'s kernel "
            f"tables: what a {cap_watts(hw, matrix_clock):.0f} W{error} board power cap of its {hw.board_w:g} W "
            f"gives ({POWER_CAP_LAW}); price it as --device {hw.key}@{cap_watts(hw, matrix_clock):.0f}W"]


def write_cap(args, hw, power: PowerLimit, std, at_bound, source, summary, log) -> int:
    """A device fitted on its own tables keeps them: the fit is the device name to price the cluster with."""
    if not args.output:
        return 0
    watts = cap_watts(hw, power.matrix_clock)
    error = std.get("matrix_clock")
    result = {"device": f"{hw.key}@{watts:.0f}W" if power.matrix_clock <= 1.0 else hw.key,
              "matrix_clock": round(power.matrix_clock, 4),
              "std_error": None if error is None else round(float(error), 4), "cap_w": round(watts, 1),
              "board_w": hw.board_w, "origin": summary, "source": {**source, **({"at_bound": at_bound} if at_bound
                                                                               else {})}}
    Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    log(f"wrote {args.output}")
    return 0


def write_overheads(args, overheads: ServingOverheads, summary: str, note: str, log) -> dict:
    """The fitted overheads as cost/engine_serving.json holds them, written to --overheads-output if given."""
    o_json = {f.name: round(getattr(overheads, f.name), 4) for f in fields(ServingOverheads)}
    if args.overheads_output:
        Path(args.overheads_output).write_text(json.dumps(
            {args.engine: {"origin": summary + (f"; {note}" if note else ""), "params": o_json}}, indent=1) + "\n")
        log(f"wrote {args.overheads_output}")
    return o_json


def write(args, hw, scaling, overheads, std, at_bound, fit_device, source, summary, note, better, log) -> int:
    rounded = {k: (None if v is None else round(float(v), 4)) for k, v in std.items()}
    o_json = write_overheads(args, overheads, summary, note, log)
    if not fit_device:
        if not args.overheads_output:
            log("nothing written: the device has its own kernel tables; --overheads-output FILE keeps the overheads")
        return 0
    if isinstance(scaling, PowerLimit):
        return write_power(args, hw, scaling, std, at_bound, source, summary, better, log)
    section = {"origin": summary, "engine": args.engine, "params": scaling.to_json(),
               "std_error": {k: v for k, v in rounded.items() if k in scaling.fitted_names()},
               "overheads": o_json, "overheads_std_error": {k: v for k, v in rounded.items() if k in o_json},
               "source": source}
    if at_bound:
        section["at_bound"] = at_bound
    if note:
        section["note"] = note
    bundled = profiles_dir() / f"{hw.key}.json"
    data = json.loads((bundled if bundled.is_file() else Path(hw.path)).read_text())
    data["engines"] = {"from": (hw.engines_data or {}).get("from", "h100"), "serving_fit": section}
    return _store(args, data, bundled, Path(args.output or f"calibrated-{hw.key}-serving.json"), better, log)


def write_power(args, hw, power: PowerLimit, std, at_bound, source, summary, better, log) -> int:
    """The profile with its `power_limit.matrix_clock` fitted (its board limits, sourced, are kept)."""
    bundled = profiles_dir() / f"{hw.key.split(':')[0]}.json"
    data = json.loads((bundled if bundled.is_file() else Path(hw.path)).read_text())
    error = std.get("matrix_clock")
    data["power_limit"].update({"matrix_clock": round(power.matrix_clock, 4), "origin": summary,
                                "std_error": None if error is None else round(float(error), 4), "source": source})
    if at_bound:
        data["power_limit"]["source"]["at_bound"] = at_bound
    return _store(args, data, bundled, Path(args.output or f"calibrated-{hw.key.split(':')[0]}-serving.json"),
                  better, log)


def _store(args, data: dict, bundled: Path, output: Path, better: bool, log) -> int:
    """Write the fitted profile to `output`; with --write-profile, replace the bundled one if the fit is better."""
    text = json.dumps(data, indent=1, allow_nan=False) + "\n"
    if output.resolve() == bundled.resolve():
        print("error: --output would overwrite the bundled profile; use --write-profile", file=sys.stderr)
        return 2
    output.write_text(text)
    log(f"wrote {output}")
    if args.write_profile:
        if not better:
            log(f"not replacing {bundled}: the fit is not better than the current profile on the fitted rows")
            return 1
        bundled.write_text(text)
        log(f"replaced {bundled}")
    return 0
