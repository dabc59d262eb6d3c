"""Fit a profile's kernel models to measured kernel times: HF eager scenarios, or an engine's kernel tables.

    python -m cost.calibrate ../shared/measurements/h200 [--profile h200] [--output F | --write-profile]
    python -m cost.calibrate --kernel-db DIR --system h100_sxm --engine vllm [--output F | --write-profile]
    python -m cost.calibrate --kernel-db OLD_WHEEL --system b200_sxm --engine trtllm --only moe --table-version 1.0.0rc6
    python -m cost.calibrate --from-serving FILE... --device mi300x --engine vllm   (serving/calibrate_serving.py)

The engine path is `cost/calibrate_engine.py`. What follows is the HF eager fit:

Each parameter group is fitted on the measurements that depend on it, with the others fixed:
dense GEMMs on the dense models' GEMM time and the large-M microbenchmarks, grouped (MoE) GEMMs
on the MoE model's GEMM time, attention on every scenario's attention time, and the
elementwise stream on the rest. The objective is the squared log error, so a 10% miss on a
1 ms kernel counts as much as on a 100 ms one. Few parameters, each a physical quantity
(fraction of peak, fixed latency), so the fit cannot memorize the points.
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from tracer.__main__ import ArgumentParser
from tracer.cli_io import dumps_strict, quiet_broken_pipe
from tracer.model_source import ModelError, ModelSpec
from tracer.trace import trace
from tracer.work import ATTENTION, GEMM, OTHER, GemmShape, Request, TraceOptions

from .estimate import price_kernel
from .execution import EAGER, build_kernels
from .kernels import gemm_time
from .measurement_schema import MeasurementError, load_measurements
from .profile import Efficiency, HardwareProfile, ProfileError, load_profile, profiles_dir
from .profile_schema import ProfileSchemaError, validate_efficiency

MEASURED_OTHER = ("elementwise", "copy", "reduce_index")


@dataclass
class Scenario:
    model: str
    phase: str
    batch: int
    query: int
    context: int
    measured_ms: dict[str, float]     # gemm, attention, other, total, wall
    kernels: list                     # unique kernels with their launch counts


def load_scenarios(directory: Path, progress=None) -> list[Scenario]:
    configs, raw, _ = load_measurements(directory)
    out = []
    for i, s in enumerate(raw):
        spec = ModelSpec(s["model"], configs[s["model"]], str(directory))
        request = Request(s["batch"], s["query"], s["context"], decode=s["phase"] == "decode")
        try:
            # the measurements ran HF eager: its MLA re-expansion, bf16 unless the config says otherwise
            kernels = build_kernels(trace(spec, request, TraceOptions(mla_form="hf")), EAGER)
        except ModelError as e:
            print(f"skipping {s['model']}: {e}", file=sys.stderr)
            continue
        unique: dict = {}
        for k in kernels:
            key = (k.name, k.op_class, k.flops, k.bytes, k.dtype, k.gemm, k.masked, k.broadcast,
                   k.op.attention if k.op else None, k.op.experts if k.op else None)
            if key in unique:
                unique[key] = replace(unique[key], count=unique[key].count + k.count)
            else:
                unique[key] = k
        by = s["by_class_ms"]
        measured = {GEMM: by["gemm"], ATTENTION: by["attention"],
                    OTHER: sum(by.get(c, 0.0) for c in MEASURED_OTHER), "total": s["gpu_kernel_ms"],
                    "wall": s.get("wall_ms", 0.0)}
        out.append(Scenario(s["model"], s["phase"], s["batch"], s["query"], s["context"], measured, list(unique.values())))
        if progress:
            progress(i + 1, len(raw))
    return out


def predict_ms(scenario: Scenario, hw: HardwareProfile) -> dict[str, float]:
    pred = {GEMM: 0.0, ATTENTION: 0.0, OTHER: 0.0}
    for k in scenario.kernels:
        pred[k.op_class] += price_kernel(k, hw).seconds * k.count * 1e3
    pred["total"] = sum(pred.values())
    launches = sum(k.count for k in scenario.kernels)
    pred["wall"] = max(pred["total"], launches * hw.efficiency.eager_host_us * 1e-3)
    return pred


def nelder_mead(f, x0: list[float], steps: list[float], iterations: int = 250) -> list[float]:
    """Minimize f from x0: plain Nelder-Mead, enough for a handful of smooth parameters."""
    simplex = [list(x0)] + [[x + (s if i == j else 0.0) for j, x in enumerate(x0)] for i, s in enumerate(steps)]
    values = [f(x) for x in simplex]
    for _ in range(iterations):
        order = sorted(range(len(simplex)), key=values.__getitem__)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        centroid = [sum(p[j] for p in simplex[:-1]) / (len(simplex) - 1) for j in range(len(x0))]
        worst = simplex[-1]
        reflect = [c + (c - w) for c, w in zip(centroid, worst)]
        fr = f(reflect)
        if fr < values[0]:
            expand = [c + 2 * (c - w) for c, w in zip(centroid, worst)]
            fe = f(expand)
            simplex[-1], values[-1] = (expand, fe) if fe < fr else (reflect, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflect, fr
        else:
            contract = [c + 0.5 * (w - c) for c, w in zip(centroid, worst)]
            fc = f(contract)
            if fc < values[-1]:
                simplex[-1], values[-1] = contract, fc
            else:
                best = simplex[0]
                simplex = [best] + [[b + 0.5 * (p - b) for b, p in zip(best, q)] for q in simplex[1:]]
                values = [values[0]] + [f(p) for p in simplex[1:]]
    return simplex[min(range(len(simplex)), key=values.__getitem__)]


def _log_error(pred: float, meas: float, delta: float = 0.2) -> float:
    """Huber loss on the log ratio: a single anomalous measurement cannot drag the whole fit."""
    if meas <= 0:
        return 0.0
    r = abs(math.log(max(pred, 1e-9) / meas))
    return r * r if r <= delta else delta * (2 * r - delta)


class Fitter:
    def __init__(self, hw: HardwareProfile, scenarios: list[Scenario], microbench: dict):
        self.hw, self.scenarios = hw, scenarios
        self.microbench = microbench
        self.linear = [m for m in microbench.get("bf16_linear", []) if m["m"] >= 512]

    def with_eff(self, **sections) -> HardwareProfile:
        return replace(self.hw, efficiency=replace(self.hw.efficiency, **sections))

    def _fit(self, section: str, names: list[str], objective, bounds: dict) -> None:
        base = getattr(self.hw.efficiency, section)

        def params(x):
            values = {}
            for n, v in zip(names, x):
                lo, hi = bounds[n]
                values[n] = lo + (hi - lo) / (1 + math.exp(-v))  # keep every parameter in its physical range
            return replace(base, **values)

        def inverse(n):
            lo, hi = bounds[n]
            y = min(max((getattr(base, n) - lo) / (hi - lo), 1e-3), 1 - 1e-3)
            return math.log(y / (1 - y))

        best = nelder_mead(lambda x: objective(self.with_eff(**{section: params(x)})),
                           [inverse(n) for n in names], [0.5] * len(names))
        self.hw = self.with_eff(**{section: params(best)})

    def gemm_objective(self, hw: HardwareProfile) -> float:
        err = 0.0
        for s in self.scenarios:
            if s.model in self.moe_models:
                continue
            err += _log_error(predict_ms(s, hw)[GEMM], s.measured_ms[GEMM])
        for m in self.linear:
            shape = GemmShape(m["m"], m["n"], m["k"])
            t = gemm_time(2.0 * m["m"] * m["n"] * m["k"], 2.0 * (m["m"] * m["k"] + m["k"] * m["n"] + m["m"] * m["n"]),
                          shape, "bf16", hw).seconds + self.launch_gap_s
            err += _log_error(t, m["s"])
        return err

    def class_objective(self, op_class: str, models=None):
        def f(hw: HardwareProfile) -> float:
            return sum(_log_error(predict_ms(s, hw)[op_class], s.measured_ms[op_class])
                       for s in self.scenarios if models is None or s.model in models)
        return f

    def run(self) -> HardwareProfile:
        # no kernel streams memory faster than a device-to-device copy: that measured ratio caps every memory fit
        copies = [c["gbps"] for c in self.microbench.get("device_copy", [])]
        COPY_CEILING = min(0.95, max(copies) / self.hw.memory_bandwidth_gbps) if copies else 0.9  # noqa: N806
        self.moe_models = {s.model for s in self.scenarios if any(k.op and k.op.experts for k in s.kernels)}
        # microbenchmarks time one call with CUDA events, which includes the launch gap the profiler excludes
        self.launch_gap_s = min(m["s"] for m in self.linear) * 0.25 if self.linear else 0.0
        self._fit("gemm", ["compute", "memory", "fixed_us", "smoothness"], self.gemm_objective,
                  {"compute": (0.3, 1.0), "memory": (0.3, COPY_CEILING), "fixed_us": (0.5, 20.0), "smoothness": (1.5, 8.0)})
        if self.moe_models:
            self._fit("grouped_gemm", ["compute", "memory", "fixed_us", "per_group_us"],
                      self.class_objective(GEMM, self.moe_models),
                      {"compute": (0.2, 1.0), "memory": (0.2, COPY_CEILING), "fixed_us": (0.5, 40.0),
                       "per_group_us": (0.001, 2.0)})
        self._fit("attention", ["compute", "masked_compute", "memory", "fixed_us", "softmax_ops"],
                  self.class_objective(ATTENTION),
                  {"compute": (0.1, 1.0), "masked_compute": (0.05, 1.0), "memory": (0.3, COPY_CEILING),
                   "fixed_us": (0.5, 20.0), "softmax_ops": (0.01, 32.0)})
        self._fit("elementwise", ["memory", "fixed_us", "broadcast_memory"], self.class_objective(OTHER),
                  {"memory": (0.2, COPY_CEILING), "fixed_us": (0.2, 10.0), "broadcast_memory": (0.1, COPY_CEILING)})
        self._fit_host()
        return self.hw

    def _fit_host(self) -> None:
        """HF eager host time per op, from the wall time of the steps the host cannot keep busy."""
        def error(us):
            hw = replace(self.hw, efficiency=replace(self.hw.efficiency, eager_host_us=us))
            return sum(_log_error(predict_ms(s, hw)["wall"], s.measured_ms["wall"])
                       for s in self.scenarios if s.measured_ms["wall"] > 0)
        best = min((x / 2 for x in range(10, 161)), key=error)  # 5-80 us in 0.5 us steps
        self.hw = replace(self.hw, efficiency=replace(self.hw.efficiency, eager_host_us=best))


def efficiency_json(eff: Efficiency, origin: str) -> dict:
    def rounded(section):
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in section.__dict__.items()}
    return {"origin": origin, "gemm": rounded(eff.gemm), "grouped_gemm": rounded(eff.grouped_gemm),
            "attention": rounded(eff.attention), "elementwise": rounded(eff.elementwise),
            "communication": eff.communication, "eager_host_us": eff.eager_host_us}


def eager_error(hw: HardwareProfile, scenarios: list[Scenario]) -> float:
    """Median absolute log error of the eager kernel total over the scenarios: the number a refit must beat."""
    errors = sorted(abs(math.log(max(predict_ms(s, hw)["total"], 1e-9) / s.measured_ms["total"]))
                    for s in scenarios if s.measured_ms["total"] > 0)
    return errors[len(errors) // 2] if errors else float("inf")


def run_eager(args) -> int:
    directory = Path(args.measurements)
    for name in ("microbench.json", "scenarios.json", "model_configs.json"):
        if not (directory / name).is_file():
            print(f"error: {directory / name} not found", file=sys.stderr)
            return 2
    hw = load_profile(args.profile or "h200")

    def progress(i, n):
        print(f"\rtracing scenarios {i}/{n}", end="", file=sys.stderr, flush=True)

    scenarios = load_scenarios(directory, progress)
    print(file=sys.stderr)
    if len(scenarios) < 8:
        print(f"error: {directory}: {len(scenarios)} usable scenarios; a fit needs at least 8", file=sys.stderr)
        return 2
    microbench = load_measurements(directory)[2]
    fitted = Fitter(hw, scenarios, microbench).run()
    origin = (f"fitted by python -m cost.calibrate on {directory.name} ({len(scenarios)} scenarios, "
              f"{len(microbench.get('bf16_linear', []))} GEMM microbenchmarks)")
    eff = efficiency_json(fitted.efficiency, origin)
    try:   # finite and in range, or nothing is written
        validate_efficiency(eff, "the fitted efficiency")
    except ProfileSchemaError as e:
        print(f"error: {e}; nothing written", file=sys.stderr)
        return 1
    if args.dry_run:
        print(dumps_strict(eff, indent=1))
        return 0
    before, after = eager_error(hw, scenarios), eager_error(fitted, scenarios)
    return write_result(hw, "efficiency", eff, args, f"median eager error {before * 100:.1f}% -> {after * 100:.1f}%",
                        after <= before * 1.001)


def profile_file(hw: HardwareProfile) -> tuple[Path, dict]:
    """The file `hw` was read from (the bundled one, else its own path) and its JSON as written."""
    source = profiles_dir() / f"{hw.key}.json"
    return source, json.loads(source.read_text()) if source.is_file() else json.loads(Path(hw.path).read_text())


def write_result(hw: HardwareProfile, section: str, value: dict, args, comparison: str, better: bool) -> int:
    """Write the profile with `section` replaced to --output (a new file by default); replace the bundled
    profile only with --write-profile, and only when the fit beats the current one on the same data."""
    source, data = profile_file(hw)
    if section == "efficiency":
        data["efficiency"] = value
    else:
        data.setdefault("engines", {})
        if "from" in data["engines"]:
            data["engines"] = {}
        data["engines"][section] = value
    text = json.dumps(data, indent=1, allow_nan=False) + "\n"
    output = Path(args.output or f"calibrated-{hw.key}-{section}.json")
    if output.resolve() == source.resolve():
        print("error: --output would overwrite the bundled profile; use --write-profile", file=sys.stderr)
        return 2
    try:
        output.write_text(text)
    except OSError as e:
        print(f"error: cannot write {output}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(f"wrote {output} ({comparison})", file=sys.stderr)
    if args.write_profile:
        if not better:
            print(f"not replacing {source}: the fit is not better than the current profile ({comparison})",
                  file=sys.stderr)
            return 1
        source.write_text(text)
        print(f"replaced {source}", file=sys.stderr)
    return 0


@quiet_broken_pipe
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--from-serving" in argv:
        # fitting to end-to-end runs needs the serving predictor, a layer above cost/: imported only on this path
        from serving.calibrate_serving import main as from_serving
        argv.remove("--from-serving")
        return from_serving(argv)
    p = ArgumentParser(prog="python -m cost.calibrate", description=__doc__.split("\n")[0])
    p.add_argument("measurements", nargs="?", help="HF-eager measurements: folder with microbench.json, "
                                                   "scenarios.json and model_configs.json")
    p.add_argument("--kernel-db", metavar="PATH", help="engine kernel tables: the aiconfigurator-core wheel or its "
                                                       "folder (see cost/kernel_db.py)")
    p.add_argument("--system", help="with --kernel-db: the tables' system, e.g. h100_sxm")
    p.add_argument("--engine", default="vllm", help="with --kernel-db: vllm, sglang or trtllm (default vllm)")
    p.add_argument("--profile", default=None, help="bundled profile to fit (default: h200, or the system's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the fit/held-out split (default 0)")
    p.add_argument("--fit-fraction", type=float, default=0.5, help="share of each table used to fit (default 0.5)")
    p.add_argument("--only", default=None, metavar="T1,T2",
                   help="with --kernel-db: refit only these tables (gemm, prefill_attention, decode_attention, moe, "
                        "custom_allreduce, nccl, quant) or one format of one (moe/bf16), keeping the profile's "
                        "other fits")
    p.add_argument("--params", default=None, metavar="P1,P2",
                   help="with --only: refit only these parameters of each refitted kernel model, every other one "
                        "kept at the profile's fit (a new mechanism's parameter, fitted without moving the rest)")
    p.add_argument("--table-version", default=None, metavar="V",
                   help="with --kernel-db and --only: fit the tables of this older collector version (e.g. "
                        "1.0.0rc6) into the engine's `releases` section, for rows and runs of that release; the "
                        "newest fit stays the engine's own")
    p.add_argument("--start-from", default=None, metavar="PROFILE",
                   help="with --kernel-db: also start each fit from this profile's fit of the same engine (a "
                        "sibling device); the best of the starts wins")
    p.add_argument("--output", default=None, help="where to write the calibrated profile (default: a new file "
                                                  "calibrated-PROFILE-SECTION.json)")
    p.add_argument("--write-profile", action="store_true",
                   help="also replace the bundled profile, if the fit beats it on the same data")
    p.add_argument("--dry-run", action="store_true", help="print the fit, write nothing")
    args = p.parse_args(argv)
    try:
        if args.kernel_db:
            from .calibrate_engine import run_engine
            return run_engine(args)
        if not args.measurements:
            p.error("give a measurements folder (HF eager) or --kernel-db PATH --system NAME (engines)")
        return run_eager(args)
    except (ProfileError, ModelError, MeasurementError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
