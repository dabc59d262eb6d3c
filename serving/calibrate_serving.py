"""Calibrate tracecost to a cluster from a handful of end-to-end serving runs.

    python -m cost.calibrate --from-serving FILE... --device D --engine E [--fit-on ID_OR_TEXT] [--overheads ...]
        [--model M --tp N --isl I --osl O --batch-size B --engine-flags "..."] [--kv-cache-tokens N]
        [--output F | --write-profile]

FILEs are `vllm bench serve --save-result` JSON, benchmark_latency.py / benchmark_throughput.py `--output-json`,
MLPerf `mlperf_log_summary.txt`, or development-set rows (serving/measurements.py); flags fill what a file does
not say. Fitted, each within its physical range:
- a device without kernel tables (its profile's engines come `from` another device): three scalings of the donor's
  kernel models (cost/engine_kernels/device_fit.py DeviceScaling: matrix throughput, HBM bandwidth, fixed cost
  per kernel), written to the profile's `engines.serving_fit` with their source;
- the engine's overheads named by --overheads (cost/engines.py ServingOverheads), written to --overheads-output in
  cost/engine_serving.json's format.
Each run is priced exactly as the commands and bench/e2e_accuracy.py price it (serving/published.py Predictor), so
the fit tunes the model users get. The loss is the squared log error of every measured metric (each row weighted
alike), minimized by bounded least squares; each number's uncertainty is its standard error from the Jacobian at
the optimum (s^2 (J^T J)^-1).
`--fit-on TEXT` fits the rows whose id or engine version contains TEXT and reports the error on the others.
"""
from __future__ import annotations

import argparse
import datetime
import math
import re
import shlex
import sys
import time
from dataclasses import fields, replace
from pathlib import Path

import numpy as np

from cost.engine_kernels.device_fit import DeviceScaling
from cost.engines import ENGINES, ServingOverheads
from cost.power import PowerLimit
from cost.profile import HardwareProfile, ProfileError, load_profile
from tracer.model_source import ModelError, resolve_model

from .calibrate_report import equivalent_cap, implied_fractions, write, write_cap, write_overheads
from .measurements import BATCH, CONCURRENCY, MAX, RATE, MeasurementError, RunFacts, ServingMeasurement, load_files
from .published import Predictor
from .published_rows import MODELS, PublishedRun, stated_release
from .steady_state import Load
from .step_cost import StepCost

METRICS = ("output_tok_s", "ttft_ms", "tpot_ms", "e2e_latency_ms")
DEFAULT_OVERHEADS = ("step_us", "seq_us")
PROGRESS_EVERY_S = 20.0   # at most one progress line this often


class ServingModel:
    """Predicts measurements on one device profile, with one set of engine overheads, exactly as every command and
    bench/e2e_accuracy.py predict a run (serving/published.py Predictor): a fit tunes the model users get."""

    def __init__(self, hw: HardwareProfile, overheads: ServingOverheads | None = None):
        self.hw, self.overheads = hw, overheads
        self.predictor = Predictor(hw)

    def set_overheads(self, overheads: ServingOverheads) -> None:
        """New engine overheads; the kernel prices stay (they do not depend on them)."""
        self.overheads = overheads

    def cost(self, m: ServingMeasurement) -> StepCost:
        return self.predictor.cost(published_run(m))

    def predict(self, m: ServingMeasurement) -> dict[str, float]:
        """The run's metrics as it measured them (a development row over several DP replicas: one replica's)."""
        run = published_run(m)
        pred, state = self.predictor.predict(run, self.overheads)
        pred["output_tok_s"] /= run.replicas
        if state is not None:
            pred["e2e_latency_ms"] = state.e2e_s.get("mean", 0.0) * 1e3
        return pred


def published_run(m: ServingMeasurement) -> PublishedRun:
    """The measurement as the predictor's run: a development row is the predictor's own reading of it; a file's
    run is built from what the file and the flags state."""
    if m.run is not None:
        return m.run
    s = m.settings
    load = {CONCURRENCY: Load(CONCURRENCY, m.load_value), RATE: Load(RATE, m.load_value)}.get(
        m.load, Load(MAX, requests=int(m.load_value)))
    # `vllm bench serve` runs come through the HTTP server; the offline scripts and MLPerf harnesses do not
    served = m.format == "vllm_serve" or s.api_server
    return PublishedRun(
        m.id, m.format, MODELS.get(m.model, m.model),
        m.device + (f"@{s.power_limit_w:g}W" if s.power_limit_w else ""), m.engine,
        stated_release(m.engine, m.engine_version), m.dtype, m.kv_dtype, m.tp, max(1, round(m.isl)),
        max(1, round(m.osl)), load, s.memory_fraction, dict(m.measured), max_num_seqs=s.max_num_seqs,
        max_batched_tokens=s.max_batched_tokens, chunked_prefill=s.chunked_prefill,
        mode="offline_batch" if m.load == BATCH else "", lengths=m.lengths,
        api_servers=max(1, s.api_servers) if served else 0, streams=m.streams, capacity_scheduler=s.capacity_scheduler,
        mixed_chunk=s.mixed_chunk, chat_requests=m.chat_requests, scheduler_steps=s.scheduler_steps,
        kv_cache_tokens=m.kv_cache_tokens)


def log_errors(pred: dict, m: ServingMeasurement) -> list[float]:
    """log(predicted / measured) of every metric the measurement has, each row weighted alike."""
    out = [math.log(pred[k] / v) for k, v in m.measured.items() if k in pred and pred[k] > 0 and v > 0]
    return [e / math.sqrt(len(out)) for e in out]


def release(m: ServingMeasurement) -> str:
    """The engine release a run names ("vLLM 0.8.5"), for grouping; its whole version text otherwise."""
    found = re.search(r"(vllm|sglang|tensorrt-llm|trt-llm)[ =v]*([0-9][0-9a-z.+]*)", m.engine_version, re.I)
    return f"{found.group(1)} {found.group(2)}" if found else (m.engine_version or "unstated")


def device_fit_applies(hw: HardwareProfile) -> bool:
    """The device runs another device's engine kernel models (no kernel tables of its own): they can be scaled."""
    return not hw.engines_data or "from" in hw.engines_data


class Fit:
    """Bounded least squares over a few named parameters: the device scaling and some engine overheads."""

    def __init__(self, hw: HardwareProfile, engine: str, rows: list[ServingMeasurement], overhead_names: list[str],
                 start_overheads: ServingOverheads, fit_device: bool, log=print, device_set: type = DeviceScaling):
        self.base, self.engine, self.rows, self.log = hw, engine, rows, log
        self.device_names = device_set.fitted_names() if fit_device else []
        self.overhead_names = list(overhead_names)
        self.start_overheads = start_overheads
        # the power limit's clock starts inside its range (1.0, no limit, is its upper bound)
        self.start_scaling = PowerLimit(matrix_clock=0.8) if device_set is PowerLimit else device_set()
        bounds = {f.name: f.metadata["bounds"] for f in fields(device_set) + fields(ServingOverheads)}
        self.names = self.device_names + self.overhead_names
        self.lo = np.array([bounds[n][0] for n in self.names], float)
        self.hi = np.array([bounds[n][1] for n in self.names], float)
        self._models: dict = {}
        self._serial = 0
        self._evaluations, self._started, self._said = 0, time.monotonic(), time.monotonic()

    def values(self, u) -> tuple[DeviceScaling, ServingOverheads]:
        v = dict(zip(self.names, self.lo + np.clip(u, 0.0, 1.0) * (self.hi - self.lo)))
        scaling = replace(self.start_scaling, **{n: float(v[n]) for n in self.device_names})
        return scaling, replace(self.start_overheads, **{n: float(v[n]) for n in self.overhead_names})

    def start(self) -> np.ndarray:
        v = [getattr(self.start_scaling, n) for n in self.device_names] + \
            [getattr(self.start_overheads, n) for n in self.overhead_names]
        return np.clip((np.array(v, float) - self.lo) / (self.hi - self.lo), 0.0, 1.0)

    def model(self, scaling: DeviceScaling, overheads: ServingOverheads) -> ServingModel:
        """A model of the device with this scaling; kernel prices are kept while only the overheads change."""
        key = scaling if self.device_names else None
        model = self._models.get(key)
        if model is None:
            self._serial += 1
            hw = with_scaling(self.base, scaling, f"#fit{self._serial}") if self.device_names else self.base
            if len(self._models) > 2:
                self._models.pop(next(iter(self._models)))
            model = self._models[key] = ServingModel(hw, overheads)
        model.set_overheads(overheads)
        return model

    def residuals(self, u, rows=None) -> np.ndarray:
        model = self.model(*self.values(u))
        r = np.array([e for m in (rows or self.rows) for e in log_errors(model.predict(m), m)])
        self._evaluations += 1
        now = time.monotonic()
        if now - self._said >= PROGRESS_EVERY_S:    # a fit of many rows runs for minutes: say how it goes
            self._said = now
            self.log(f"  {self._evaluations} evaluations, {now - self._started:.0f} s: rms log error "
                     f"{math.sqrt(float(r @ r) / max(1, len(r))):.3f}")
        return r

    def run(self) -> tuple[np.ndarray, np.ndarray, float]:
        """(fitted values, their standard errors, final mean squared log error) in the parameters' units."""
        from scipy.optimize import least_squares
        result = least_squares(self.residuals, self.start(), bounds=(0.0, 1.0), diff_step=0.01, x_scale=0.1,
                               max_nfev=40, verbose=0)
        self.log(f"least squares: {result.nfev} evaluations ({result.message})")
        u, r, jac = result.x, result.fun, result.jac
        dof = max(1, len(r) - len(u))
        s2 = float(r @ r) / dof
        try:
            cov = np.linalg.pinv(jac.T @ jac) * s2
            std = np.sqrt(np.maximum(np.diag(cov), 0.0)) * (self.hi - self.lo)
        except np.linalg.LinAlgError:
            std = np.full(len(u), np.inf)
        return self.lo + u * (self.hi - self.lo), std, float(r @ r) / max(1, len(r))


def with_scaling(hw: HardwareProfile, scaling: DeviceScaling | PowerLimit, tag: str) -> HardwareProfile:
    """The profile with its inherited engine models scaled by `scaling`, or its matrix clock set by a power limit
    (a candidate of the fit)."""
    if isinstance(scaling, PowerLimit):
        return replace(hw, matrix_clock=scaling.matrix_clock, path=f"{hw.path}{tag}")
    raw = dict(hw.engines_data) if hw.engines_data else {"from": "h100"}
    raw["serving_fit"] = {"params": scaling.to_json(), "origin": "a serving fit in progress"}
    return replace(hw, engines_data=raw, path=f"{hw.path}{tag}")


def errors_by_group(model: ServingModel, rows: list[ServingMeasurement]) -> dict:
    """(release, load, metric) -> signed relative errors."""
    out: dict = {}
    for m in rows:
        pred = model.predict(m)
        for k, v in m.measured.items():
            if k in pred and v > 0:
                out.setdefault((release(m), m.load, k), []).append(pred[k] / v - 1.0)
    return out


def _median(v: list[float]) -> float:
    return float(np.median(v)) if v else float("nan")


def error_table(title: str, groups: dict) -> list[str]:
    lines = [title, f"  {'release':<22} {'load':<6} {'metric':<15} {'rows':>4} {'median |err|':>12} {'signed':>8}"]
    for (rel, load, metric), e in sorted(groups.items()):
        lines.append(f"  {rel:<22} {load:<6} {metric:<15} {len(e):>4} {_median([abs(x) for x in e]) * 100:>11.1f}% "
                     f"{_median(e) * 100:>+7.1f}%")
    every = [x for e in groups.values() for x in e]
    lines.append(f"  {'all':<22} {'':<6} {'':<15} {len(every):>4} {_median([abs(x) for x in every]) * 100:>11.1f}% "
                 f"{_median(every) * 100:>+7.1f}%")
    return lines


def usable_rows(rows: list[ServingMeasurement], hw: HardwareProfile, engine: str, log) -> list[ServingMeasurement]:
    """The rows of this device and engine that tracecost can trace and price; the others are counted and skipped."""
    out, skipped, models, priced = [], {}, {}, ServingModel(hw)
    for m in rows:
        try:
            same = load_profile(m.device).key.split(":")[0] == hw.key.split(":")[0]
        except ProfileError:
            same = False
        why = None if same else f"device {m.device}"
        if why is None and m.engine != engine:
            why = f"engine {m.engine}"
        why = why or m.unpriced or None
        if why is None and not m.measured:
            why = "no measured metric"
        if why is None:
            if m.model not in models:
                try:
                    resolve_model(MODELS.get(m.model, m.model))
                    models[m.model] = None
                except ModelError as e:
                    models[m.model] = f"model {m.model} ({str(e)[:60]})"
            why = models[m.model]
        if why is None:
            try:
                priced.predict(m)
            except ValueError as e:     # a setup that serves nothing (its KV cache holds less than one request)
                why = "not priced: " + re.sub(r"\d[\d,.]*", "N", str(e))
        if why:
            skipped[why] = skipped.get(why, 0) + 1
        else:
            out.append(m)
    for why, n in sorted(skipped.items()):
        log(f"skipped {n} rows: {why}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m cost.calibrate --from-serving", description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="+", help="serving measurement files (see the module docstring)")
    p.add_argument("--device", required=True, help="profile to calibrate (bundled name or .json path)")
    p.add_argument("--engine", required=True, choices=list(ENGINES), help="the engine the runs used")
    p.add_argument("--fit-on", metavar="TEXT", help="fit the rows whose id or engine version contains TEXT (or one "
                                                    "of several, comma-separated); report the others as held out "
                                                    "(default: fit every row)")
    p.add_argument("--overheads", default="auto", help="engine overheads to fit, comma-separated ServingOverheads "
                                                       "fields, 'none', or 'auto' (step_us, seq_us; gpu_sync_us "
                                                       "when the rows span several TP sizes)")
    for flag, kind, text in (("--model", str, "model of runs whose file does not say it"),
                             ("--tp", int, "tensor-parallel size"), ("--dtype", str, "weight format (bf16, fp8, ...)"),
                             ("--kv-dtype", str, "KV-cache format"), ("--isl", float, "prompt tokens per request"),
                             ("--osl", float, "output tokens per request"),
                             ("--batch-size", int, "benchmark_latency.py's --batch-size"),
                             ("--engine-flags", str, "the engine's launch flags (--max-num-seqs, "
                                                     "--max-num-batched-tokens, --enable-chunked-prefill, ...)")):
        p.add_argument(flag, type=kind, help=f"{text}, where a file does not say")
    p.add_argument("--kv-cache-tokens", type=int, metavar="N",
                   help="the KV capacity per engine copy that the engine logged at start (vLLM: 'GPU KV cache size: "
                        "N tokens'): the runs are priced at it instead of tracecost's estimate from memory, so that "
                        "a capacity error does not pass for a kernel speed (development-set rows state their own)")
    p.add_argument("--fit-power", action="store_true",
                   help="fit the power limit's matrix clock (the profile's power_limit.matrix_clock, cost/power.py) "
                        "instead of the four kernel scalings: a power-capped part carrying a less capped "
                        "sibling's kernel models; on a device with its own kernel tables, the board power cap "
                        "this cluster's dense matrix work runs as (priced as DEVICE@WATTSW)")
    p.add_argument("--output", help="calibrated profile to write (default calibrated-DEVICE-serving.json)")
    p.add_argument("--overheads-output", help="also write the fitted overheads in cost/engine_serving.json's format")
    p.add_argument("--write-profile", action="store_true", help="replace the bundled profile if the fit beats it "
                                                                "on the fitted rows")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)
    try:
        return run(args, ["python -m cost.calibrate --from-serving", *argv])
    except (MeasurementError, ProfileError, ModelError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _overhead_names(text: str, rows: list[ServingMeasurement]) -> list[str]:
    # a release's kernel time would only restate the device's kernel scaling this fit already makes
    known = [f.name for f in fields(ServingOverheads) if f.name != "kernel_time"]
    if text == "none":
        return []
    if text == "auto":
        return list(DEFAULT_OVERHEADS) + (["gpu_sync_us"] if len({m.tp for m in rows}) > 1 else [])
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        if n == "kernel_time":
            raise ValueError("--overheads: kernel_time is a release's own term (python -m serving.calibrate_overheads "
                             "--release); this fit's device kernel scaling stands for it")
        if n not in known:
            raise ValueError(f"--overheads: unknown overhead '{n}' (choose from {', '.join(known)})")
    return names


def run(args, argv: list[str]) -> int:
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    if args.kv_cache_tokens is not None and args.kv_cache_tokens <= 0:
        raise ValueError(f"--kv-cache-tokens must be a positive number of tokens, got {args.kv_cache_tokens}")
    facts = RunFacts(args.model, args.device, args.engine, args.tp, args.dtype, args.kv_dtype, args.isl, args.osl,
                     args.batch_size, args.engine_flags, args.kv_cache_tokens)
    hw = load_profile(args.device)
    rows = usable_rows(load_files(args.files, facts), hw, args.engine, log)
    if args.fit_on:
        texts = [t.strip() for t in args.fit_on.split(",") if t.strip()]
        fit_rows = [m for m in rows if any(t in m.id or t in m.engine_version for t in texts)]
        held = [m for m in rows if m not in fit_rows]
    else:
        fit_rows, held = rows, []
    names = _overhead_names(args.overheads, fit_rows)
    device_set = PowerLimit if args.fit_power else DeviceScaling
    # a device with its own kernel tables takes only --fit-power: the clock this cluster holds during dense matrix
    # work against the tables' own runs, which is a board power cap by the cap law (cost/power.py)
    cap_fit = args.fit_power and not device_fit_applies(hw)
    fit_device = device_fit_applies(hw) or cap_fit
    if cap_fit and args.write_profile:
        raise ValueError(f"--write-profile: {hw.key}'s kernel models are fitted on its own tables and stay; "
                         f"--fit-power fits the cluster's equivalent power cap, priced as {hw.key}@WATTSW")
    if cap_fit and not hw.board_w:
        raise ValueError(f"--fit-power: {hw.key} states no board power (board_w), so no cap can be fitted")
    if args.fit_power and not cap_fit and not hw.power_origin:
        raise ValueError(f"--fit-power: {hw.key} has no power_limit section; add one with its sourced board_w and "
                         f"reference_board_w first (cost/power.py)")
    count = len(names) + (len(device_set.fitted_names()) if fit_device else 0)
    if len(fit_rows) <= count:
        where = f" (--fit-on {args.fit_on})" if args.fit_on else ""
        raise ValueError(f"{len(fit_rows)} usable rows to fit{where}: too few for {count} parameters")
    if not names and not fit_device:
        raise ValueError(f"{hw.key} has its own kernel tables and --overheads none leaves nothing to fit")
    filled = sorted({f for m in rows for f in m.filled})
    if filled:
        log(f"taken from flags, not the files: {', '.join(filled)}")
    start, origin = serving_overheads_start(args.engine)
    note = ""
    tps = {m.tp for m in fit_rows}
    if "step_us" in names and "gpu_sync_us" not in names and len(tps) == 1 and max(tps) > 1:
        # one TP size: rank sync and host work are both a cost per step, one number; fold the sync into the step
        tp = tps.pop()
        start = replace(start, step_us=min(20000.0, start.step_us + start.gpu_sync_us * (tp - 1)), gpu_sync_us=0.0)
        note = f"every fitted row is TP {tp}: step_us holds the rank sync too (gpu_sync_us set to 0)"
    log(f"fitting {len(fit_rows)} rows ({len(held)} held out): "
        f"{', '.join((device_set.fitted_names() if fit_device else []) + names)}; overheads start from {origin}")
    fit = Fit(hw, args.engine, fit_rows, names, start, fit_device, log, device_set)
    values, std, mse = fit.run()
    scaling, overheads = fit.values((values - fit.lo) / (fit.hi - fit.lo))
    before, after = ServingModel(hw), fit.model(scaling, overheads)
    lines = [f"fitted {len(fit_rows)} rows of {hw.name}, {ENGINES[args.engine].label}: rms log error "
             f"{math.sqrt(mse):.3f}"]
    docs = {**device_set.describe(), **ServingOverheads.describe()}
    # a value at its bound has no standard error from the Jacobian: the data push it past its physical range
    at_bound = [n for n, v, lo, hi in zip(fit.names, values, fit.lo, fit.hi) if min(v - lo, hi - v) < 1e-3 * (hi - lo)]
    errors = {n: (None if n in at_bound else s) for n, s in zip(fit.names, std)}
    for n, v, lo, hi in zip(fit.names, values, fit.lo, fit.hi):
        error = "at its bound" if errors[n] is None else f"+- {errors[n]:.3g}"
        lines.append(f"  {n:<12} {v:10.4g} {error:<14} in [{lo:g}, {hi:g}]: {docs[n]}")
    if note:
        lines.append(f"  note: {note}")
    if fit_device and not args.fit_power:
        lines += implied_fractions(after.hw, fit_rows)
    if cap_fit:
        lines += equivalent_cap(hw, scaling.matrix_clock, errors["matrix_clock"])
    lines += error_table("fitted rows, before (current profile) -> after:", errors_by_group(before, fit_rows))
    lines += error_table("  after:", errors_by_group(after, fit_rows))
    if held:
        lines += error_table(f"held-out rows ({len(held)}, not fitted), before:", errors_by_group(before, held))
        lines += error_table("  after:", errors_by_group(after, held))
    print("\n".join(lines))
    source = {"command": shlex.join(argv).replace("'python -m cost.calibrate --from-serving'",
                                                   "python -m cost.calibrate --from-serving"),
              "files": [Path(f).name for f in args.files], "fitted_rows": [m.id for m in fit_rows],
              "held_out_rows": len(held), "date": datetime.date.today().isoformat()}
    held_median = _median([abs(x) for e in errors_by_group(after, held).values() for x in e]) if held else None
    summary = (f"fitted by python -m cost.calibrate --from-serving on {len(fit_rows)} {ENGINES[args.engine].label} "
               f"runs ({', '.join(sorted({release(m) for m in fit_rows}))})"
               + (f"; held-out median error {held_median * 100:.1f}% over {len(held)} rows" if held else ""))
    before_mse = float(np.mean([x * x for m in fit_rows for x in log_errors(before.predict(m), m)]))
    if cap_fit:
        write_overheads(args, overheads, summary, note, log)
        return write_cap(args, hw, scaling, errors, at_bound, source, summary, log)
    return write(args, hw, scaling, overheads, errors, at_bound, fit_device, source, summary, note,
                 mse <= before_mse, log)


def serving_overheads_start(engine: str) -> tuple[ServingOverheads, str]:
    """The bundled overheads: every fit starts from them and from the donor's unscaled kernel models, not from the
    profile's current fit, so the command stored with a fit reproduces it."""
    from cost.engines import serving_overheads
    params, origin = serving_overheads(engine)
    return params, f"the bundled {ENGINES[engine].label} overheads ({origin[:60]}...)"


if __name__ == "__main__":
    sys.exit(main())
