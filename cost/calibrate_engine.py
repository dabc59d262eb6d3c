"""Fit one engine's kernel models on one device to the published kernel tables.

Each kernel model (GEMM per weight format, attention per phase and KV format, fused MoE per weight
format, all-reduce per implementation and GPU count, activation quantization) is fitted on a seeded
random half of its table's rows by robust least squares on the log time ratio, within each parameter's
physical range. The other half is never seen by the fit: `bench/kernel_accuracy.py` reports on it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

import numpy as np

from .engine_kernels import (CollectiveCurve, DecodeAttentionParams, EngineCalibration, GemmParams, MoeParams,
                             PrefillAttentionParams, StreamParams, quant_time)
from .engine_kernels.calibration import ATTENTION_BACKENDS
from .engine_kernels.common import release_series
from .engine_kernels.moe_runners import key_format
from .kernel_db import COLLECTORS, Collector, KernelTable
from .kernel_rows import group_rows, price_group
from .profile import HardwareProfile

MAX_FIT_ROWS = 4000   # a random subset of the fit half bounds the time of each fit


def split(n: int, seed: int = 0, fraction: float = 0.5) -> np.ndarray:
    """True for the rows a fit may use: a seeded random `fraction` of a table."""
    return np.random.default_rng(seed).random(n) < fraction


def least_squares_fit(initial, predict, measured: np.ndarray, restarts=(), free: frozenset | None = None):
    """Parameters minimizing a robust (soft-L1, ~10% scale) loss of log(predicted / measured), within bounds.
    Parameters that act in steps (declared with a grid) are tried at each grid point, from `initial`, from
    each of `restarts` (a previous fit can sit in a local minimum the defaults avoid) and from each declared
    start of a parameter; the best fit wins.

    `free`: fit only these parameters, every other one held at `initial`'s value, from `initial` alone (a new
    mechanism's parameter fitted without moving a previous fit: restarts and other starts would move the rest).

    A grid parameter is held at its grid value outside the solver's vector. (It used to stay in it, pinned
    by bounds 1e-9 wide: its finite-difference step then crossed the wave and split counts' integer edges,
    `ceil(slots / items)` at slots / items whole, giving derivatives of ~1e8 that froze every other
    parameter at its start -- GB300's and B300's windowed decode fits came back as the defaults.)"""
    from itertools import product

    from scipy.optimize import least_squares
    low, high = initial.bounds()
    names = initial.fitted_names()
    grids = initial.grids()
    held = free is not None          # only the `free` parameters move
    chosen = free if held else frozenset(names)
    if held:
        grids = {n: values for n, values in grids.items() if n in chosen}
        restarts = ()
    moving = np.array([n not in grids and n in chosen for n in names])   # the solver's vector

    def residuals(x_free, full):
        x = full.copy()
        x[moving] = x_free
        with np.errstate(all="ignore"):
            pred = predict(initial.with_vector(x))
        r = np.log(np.maximum(pred, 1e-12) / measured)
        return np.where(np.isfinite(r), r, 10.0)

    best, best_cost = initial, np.inf
    origins = [initial, *restarts]
    if not held:
        origins += [replace(initial, **{name: value}) for name, values in initial.starts().items()
                    for value in values]
    lo, hi = low[moving], high[moving]
    for origin, point in product(origins, product(*grids.values()) if grids else [()]):
        full = replace(origin, **dict(zip(grids, point))).vector()
        x0 = np.clip(full[moving], lo + 1e-12 * (hi - lo), hi - 1e-12 * (hi - lo))
        if not moving.any():      # only grid parameters chosen: each grid point as it is
            z = (residuals(x0, full) / 0.1) ** 2
            cost = float(np.sum(np.sqrt(1.0 + z) - 1.0))
            if cost < best_cost:
                best, best_cost = initial.with_vector(full), cost
            continue
        result = least_squares(residuals, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.1, args=(full,),
                               x_scale=np.maximum(np.abs(x0), 1e-3), diff_step=1e-3, max_nfev=300 if not grids else 120)
        if result.cost < best_cost:
            full[moving] = np.clip(result.x, lo, hi)
            best, best_cost = initial.with_vector(full), result.cost
    return best


@dataclass
class FitReport:
    group: tuple
    fit_rows: int
    held_rows: int


def _groups(table: KernelTable, engine: str, decode_sets: dict | None = None) -> dict[tuple, np.ndarray]:
    return {k: np.array(v) for k, v in group_rows(table.rows, engine, decode_sets).items()}


def _subset(index: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return index if len(index) <= MAX_FIT_ROWS else np.sort(rng.choice(index, MAX_FIT_ROWS, replace=False))


def calibrate(tables: dict[str, KernelTable], hw: HardwareProfile, engine: str, origin: str, seed: int = 0,
              fraction: float = 0.5, base: EngineCalibration | None = None, progress=None,
              only: set[str] | None = None, release: str | None = None,
              sibling: EngineCalibration | None = None, params: frozenset | None = None) -> EngineCalibration:
    """Fit every kernel model the tables cover (or the tables named in `only`, keeping `base` for the rest);
    `base` also supplies starting points and the sections no table covers. `sibling`: another device's fit of
    the same engine, one more start for every model (the best fit wins): a fit can settle in a local minimum
    its own previous fit and the defaults both lead to. `params`: fit only these parameters of each refitted
    model, the rest kept at `base`'s values (least_squares_fit's `free`)."""
    rng = np.random.default_rng(seed + 1)
    collector = COLLECTORS.get(engine, Collector())
    cal = EngineCalibration(engine=engine, origin=origin, release=release)
    say = progress or (lambda message: None)
    # rows by the kernel model that prices them; a model's rows may come from more than one table: vLLM's one-token
    # prompts of the context table run its decode kernel (cost/engines.py one_token_query_decodes)
    # the kernel data of the base's decode sets (tensor_core_group) splits a format's rows between two kernels
    grouped = {name: _groups(t, engine, base.decode_attention if base else None)
               for name, t in tables.items() if name != "quant"}
    if only is not None:   # sections (moe) or one format's group of one (moe/bf16), and the tables holding their rows
        wanted = {o.split("/")[0] for o in only}
        tables = {name: t for name, t in tables.items()
                  if name in wanted or any(_section(key) in wanted for key in grouped.get(name, ()))}

    if "quant" in tables:
        t = tables["quant"]
        keep = split(len(t.rows), seed, fraction)
        m = np.array([r[0] for r in t.rows], float)[keep]
        k = np.array([r[1] for r in t.rows], float)[keep]
        start = (base.quant if base and base.quant else StreamParams())
        quant = least_squares_fit(start, lambda p: quant_time(p, hw.bandwidth, hw.l2_bytes, m, k).seconds,
                                  t.seconds[keep])
        say(f"quant: {keep.sum()} rows")
    else:
        quant = base.quant if base and base.quant else StreamParams()
    if "quant" in tables or base is None:
        # the fused norm / activation kernels are streaming kernels like the quantization one
        elementwise = replace(quant, row_ns=0.0)
    else:
        # kept as the base has it; one it takes from another engine's fit (B200's TensorRT-LLM: its quantize tables
        # time a chain of torch ops) stays there: written back, it would read as this fit's
        elementwise = None if "elementwise" in base.inherited else base.elementwise
    cal = replace(cal, quant=quant, elementwise=elementwise)

    keep = base if (only is not None and base is not None) else None
    # a format the base takes from another fit (its profile's `carried`, or this device's default engine) stays
    # where it comes from: written back, it would read as this device's own fit
    taken = keep.inherited if keep else {}
    sections = {name: {k: v for k, v in getattr(keep, name).items() if f"{name}.{k}" not in taken} if keep else {}
                for name in ("gemm", "prefill_attention", "decode_attention", "moe", "allreduce")}
    groups: dict[tuple, tuple[list, list]] = {}
    for name in ("gemm", "prefill_attention", "decode_attention", "moe", "custom_allreduce", "nccl"):
        if name not in tables:
            continue
        t = tables[name]
        keep = split(len(t.rows), seed, fraction)
        for key, index in grouped[name].items():
            rows, seconds = groups.setdefault(key, ([], []))
            rows += [t.rows[i] for i in index[keep[index]]]
            seconds += list(t.seconds[index[keep[index]]])
    for key, (members, member_seconds) in groups.items():
        name = _section(key)
        fit_index = _subset(np.arange(len(members)), rng)
        if len(fit_index) < 8 or (only is not None and name not in only and f"{name}/{key[-1]}" not in only):
            continue
        rows, measured = [members[i] for i in fit_index], np.array(member_seconds)[fit_index]
        start = _start(key, base)
        fresh = start.defaults_keeping_data()   # a restart from the defaults on the same kernel
        if key[0] == "gemm" and key[1] in collector.host_issued_gemm:
            # the host's issue time binds only where it is above the device's: start it at the floor; a
            # previous fit without it put that floor into the device terms, so it is no start
            floor = float(np.percentile(measured, 10)) * 1e6
            start = start if start.host_us > 0.0 else fresh
            start, fresh = (replace(s, host_us=s.host_us or floor) for s in (start, fresh))
        restarts = [fresh] if fresh != start else []
        if sibling is not None and (other := _start(key, sibling)) not in (start, fresh):
            restarts.append(other)
        fitted = least_squares_fit(start, lambda p, k=key, r=rows: price_group(cal, hw, k, r, p).seconds,
                                   measured, restarts=tuple(restarts), free=params)
        _store(sections, key, fitted)
        say(f"{'/'.join(map(str, key))}: {len(fit_index)} rows")
    return replace(cal, gemm=sections["gemm"], prefill_attention=sections["prefill_attention"],
                   decode_attention=sections["decode_attention"], moe=sections["moe"], allreduce=sections["allreduce"],
                   # what the device's data says of how the engine runs its kernels there is not fitted: kept
                   carried=base.carried if base is not None else {},
                   sink_attention=base.sink_attention if base is not None else {},
                   mixed_step_decodes=base.mixed_step_decodes if base is not None else {})


SECTION_PARAMS = {"gemm": GemmParams, "prefill_attention": PrefillAttentionParams,
                  "decode_attention": DecodeAttentionParams, "moe": MoeParams, "custom_allreduce": CollectiveCurve,
                  "nccl": CollectiveCurve}


def _free_params(text: str | None, only: set[str] | None, sibling) -> frozenset | None:
    """--params: the fitted parameters of the --only sections to refit alone."""
    if not text:
        return None
    if only is None or sibling is not None:
        raise ValueError("--params refits named parameters of the --only tables from the profile's own fit: "
                         "give --only, and no --start-from")
    names = frozenset(n.strip() for n in text.split(",") if n.strip())
    sections = {o.split("/")[0] for o in only}
    unknown = sorted(sections - set(SECTION_PARAMS))
    if unknown:
        raise ValueError(f"--params: --only names '{unknown[0]}', whose fit --params does not hold apart "
                         f"(tables it does: {', '.join(SECTION_PARAMS)})")
    known = set().union(*(SECTION_PARAMS[s].fitted_names() for s in sections))
    missing = sorted(names - known)
    if not names or missing:
        raise ValueError(f"--params: '{missing[0] if missing else text}' is no fitted parameter of "
                         f"{', '.join(sorted(sections))} (they are: {', '.join(sorted(known))})")
    return names


def _measured_models(value: dict, tables: dict[str, KernelTable], engine: str, sections: set[str]) -> dict:
    """Of `sections` of a fit's JSON, the kernel models its tables hold rows of: a release's section keeps none of
    the newest fit's others (its block-fp8 MoE where the release's tables time no block-fp8)."""
    measured: dict[str, set] = {}
    for name, t in tables.items():
        if name != "quant":
            for key in group_rows(t.rows, engine):
                measured.setdefault(_section(key), set()).add(key[-1])
    out = {}
    for section in sorted(sections & set(value)):
        models = value[section]
        if isinstance(models, dict) and section in ("gemm", "moe", "prefill_attention", "decode_attention"):
            models = {k: v for k, v in models.items() if k in measured.get(section, ())}
        if models:
            out[section] = models
    return out


def _section(key: tuple) -> str:
    """The table name a kernel model's group belongs to, as `--only` names it."""
    if key[0] == "attention":
        return f"{key[1]}_attention"
    if key[0] == "allreduce":
        return "custom_allreduce" if key[1] == "custom" else "nccl"
    return key[0]


def _start(key: tuple, base: EngineCalibration | None):
    kind = key[0]
    if kind == "gemm":
        return (base.gemm.get(key[1]) if base else None) or GemmParams()
    if kind == "attention":
        table = (base.prefill_attention if key[1] == "prefill" else base.decode_attention) if base else {}
        if key[2].endswith("_tc") and key[2] not in table:
            # FlashInfer's tensor-core decode, first fitted: from the CUDA-core kernel's fit
            return replace(table.get(key[2].removesuffix("_tc")) or DecodeAttentionParams(), tensor_core_group=0)
        backend = next((b for b in ATTENTION_BACKENDS if key[2].endswith(f"_{b}")), "")
        if backend and key[2] not in table:
            # another backend's kernels, first fitted: from the default backend's fit of the format
            key = (*key[:2], key[2].removesuffix(f"_{backend}"))
        if key[2].endswith("_mha") and key[2] not in table:
            # an engine's multi-head decode kernel, first fitted: from its grouped-query sibling, a CTA per query head
            plain = table.get(key[2].removesuffix("_mha")) or DecodeAttentionParams()
            return replace(plain, max_group=1, pack_gqa=0.0)
        return table.get(key[2]) or (PrefillAttentionParams() if key[1] == "prefill" else DecodeAttentionParams())
    if kind == "moe":   # a runner's own model, first fitted: from its format's (moe_runners.py)
        return (base.moe.get(key[1]) or base.moe.get(key_format(key[1])) if base else None) or MoeParams()
    curves = base.allreduce.get(key[1], {}) if base else {}
    return curves.get(key[2]) or CollectiveCurve()


def _store(sections: dict, key: tuple, params) -> None:
    kind = key[0]
    if kind == "gemm":
        sections["gemm"][key[1]] = params
    elif kind == "attention":
        sections[f"{key[1]}_attention"][key[2]] = params
    elif kind == "moe":
        sections["moe"][key[1]] = params
    else:
        sections["allreduce"].setdefault(key[1], {})[key[2]] = params


SYSTEM_PROFILES = {"h100_sxm": "h100", "h200_sxm": "h200", "b200_sxm": "b200", "a100_sxm": "a100", "l40s": "l40s",
                   # issue 20's fleet: AIConfigurator 0.12's other systems with a bundled profile
                   "gb200": "gb200", "gb300": "gb300", "b300_sxm": "b300", "h100_pcie": "h100pcie",
                   "rtx_pro_6000_server": "rtxpro6000", "l4": "l4"}


def system_list(text: str) -> list[str]:
    """argparse type: comma-separated table systems that have a bundled profile."""
    import argparse
    systems = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEM_PROFILES]
    if unknown or not systems:
        raise argparse.ArgumentTypeError(f"unknown system '{unknown[0] if unknown else text}' "
                                         f"(choose from {', '.join(SYSTEM_PROFILES)})")
    return systems


def held_out_errors(cal: EngineCalibration, hw: HardwareProfile, tables: dict[str, KernelTable], seed: int = 0,
                    fraction: float = 0.5) -> dict[str, tuple[list, np.ndarray]]:
    """Per table: the rows the fit did not use and predicted / measured - 1 for each."""
    from .kernel_rows import price_rows
    out = {}
    for name, t in tables.items():
        if name == "quant":
            continue
        held = ~split(len(t.rows), seed, fraction)
        rows = [r for r, h in zip(t.rows, held) if h]
        out[name] = (rows, price_rows(cal, hw, rows) / t.seconds[held] - 1.0)
    return out


def _median_log_error(errors: dict) -> float:
    values = np.concatenate([np.abs(np.log1p(e)) for _, e in errors.values()]) if errors else np.array([np.inf])
    return float(np.median(values))


def run_engine(args) -> int:
    from tracer.cli_io import dumps_strict
    import sys

    from .calibrate import profile_file, write_result
    from .engines import ENGINES
    from .kernel_db import load_tables, without_impossible_rows
    from .profile import ProfileError, load_profile
    if args.engine not in ENGINES:
        raise ValueError(f"--engine must be one of {', '.join(ENGINES)}")
    if not args.system:
        raise ValueError("--kernel-db needs --system (e.g. h100_sxm)")
    if not 0.05 <= args.fit_fraction <= 1.0:
        raise ValueError("--fit-fraction must be in [0.05, 1]")
    profile = args.profile or SYSTEM_PROFILES.get(args.system)
    if profile is None:
        raise ValueError(f"no bundled profile for system '{args.system}': name one with --profile")
    hw = load_profile(profile)
    sibling = None
    if getattr(args, "start_from", None):
        sibling = load_profile(args.start_from).engine(args.engine)
        if not sibling.origin.startswith("fitted"):
            raise ValueError(f"--start-from {args.start_from}: its {args.engine} kernel models are not fitted "
                             f"({sibling.origin})")
    only = set(args.only.split(",")) if getattr(args, "only", None) else None
    params = _free_params(getattr(args, "params", None), only, sibling)
    version = getattr(args, "table_version", None)
    if version and only is None:
        raise ValueError("--table-version fits an older release's kernels beside the newest fit: name the tables "
                         "whose kernels it changed with --only (e.g. --only moe)")
    tables = load_tables(args.kernel_db, args.system, args.engine, version)
    if version:
        tables = {name: t for name, t in tables.items() if name in {o.split("/")[0] for o in only}}
    tables, set_aside = without_impossible_rows(tables, hw)
    for note in set_aside:
        print(f"{args.system} {args.engine} {note}", file=sys.stderr)
    versions = sorted({f.split("/")[-2] for t in tables.values() for f in t.source.split("; ") if "/nccl/" not in f})
    rows = sum(len(t.rows) for t in tables.values())
    origin = (f"fitted by python -m cost.calibrate --kernel-db on AIConfigurator {args.system} {args.engine} "
              f"{'/'.join(versions)} kernel tables ({rows} rows; seed {args.seed}, fit fraction {args.fit_fraction:g})")
    try:
        current = hw.engine(args.engine)
        current = current if current.origin.startswith("fitted") else None
    except ProfileError:
        current = None
    if only is not None and current is None:
        raise ValueError("--only refits some tables of an existing calibration; this profile has none for "
                         f"{args.engine}")
    if only is not None:    # what the profile's origin says beyond its tables (a section it takes elsewhere) holds
        origin += re.sub(r"^.*?fit fraction [\d.]+\)", "", current.origin, count=1)
    cal = calibrate(tables, hw, args.engine, origin, args.seed, args.fit_fraction, base=current,
                    progress=lambda m: print(f"fitted {m}", file=sys.stderr, flush=True), only=only,
                    release="/".join(versions), sibling=sibling, params=params)
    if args.dry_run:
        print(dumps_strict(cal.to_json(), indent=1))
        return 0
    after = _median_log_error(held_out_errors(cal, hw, tables, args.seed, args.fit_fraction))
    before = _median_log_error(held_out_errors(current, hw, tables, args.seed, args.fit_fraction)) \
        if current is not None else float("inf")
    comparison = (f"held-out median error {'none' if current is None else f'{before * 100:.1f}%'} -> "
                  f"{after * 100:.1f}%")
    value, written = cal.to_json(), profile_file(hw)[1].get("engines", {}).get(args.engine, {})
    if version:     # the release's sections beside the newest fit, which stays as it is
        fitted = _measured_models(value, tables, args.engine, {o.split("/")[0] for o in only})
        value = {**written, "releases": {**written.get("releases", {}), release_series(version): {
            "origin": origin, "release": version, **fitted}}}
        comparison += f" (release {version}'s tables, against the newest fit)"
    elif "releases" in written:     # a refit of the newest tables keeps the older releases' fits
        value["releases"] = written["releases"]
    return write_result(hw, args.engine, value, args, comparison, after <= before * 1.001)
