"""python -m hw_profiles [NAME|PATH] [--json]: list the hardware profiles, or show one with its sources."""
from __future__ import annotations

import sys

from cost.profile import USABLE_SHARE, ProfileError, load_profile, profile_names
from tracer.__main__ import ArgumentParser
from tracer.cli_io import dumps_strict, quiet_broken_pipe
from tracer.table import format_table


def _fmt(rates: dict[str, float]) -> str:
    return " ".join(f"{k}:{v:g}" for k, v in sorted(rates.items()))


def _engines(hw) -> dict:
    """The engines that run on the device, with their calibrations."""
    from cost.engines import ENGINES, engine_refusal
    return {name: hw.engine(name) for name in ENGINES if engine_refusal(name, hw.vendor, hw.name) is None}


def _refused(hw) -> dict[str, str]:
    from cost.engines import ENGINES, engine_refusal
    return {name: engine_refusal(name, hw.vendor, hw.name) for name in ENGINES
            if engine_refusal(name, hw.vendor, hw.name) is not None}


def fit_status(hw, engine: str) -> str:
    """One engine's fit on the device: fitted, refused, or which profile's (and engine's) fit it carries."""
    from cost.engines import engine_refusal
    from cost.provenance import kernel_origin, kernels_fitted_on
    if engine_refusal(engine, hw.vendor, hw.name):
        return "refused"
    origin = kernel_origin(hw, engine)
    if not origin.carried_over:
        carried = [f"{key} from {spec['from'] if spec['from'] != hw.key else 'this device'}"
                   + (f" ({spec['engine']})" if spec.get("engine") else "")
                   for key, spec in hw.engine(engine).carried.items()]
        return "fitted" + (f" ({', '.join(carried)})" if carried else "")
    fitted, kernels_engine, scaled = kernels_fitted_on(hw, engine)
    where = "this device" if fitted is not None and fitted.key == hw.key else (fitted.key if fitted else "none")
    return (f"from {where}" + (f" ({kernels_engine})" if kernels_engine != engine else "")
            + (" scaled" if scaled else ""))


def _engine_summary(hw) -> str:
    """Each engine's fit on the device (python -m hw_profiles NAME gives its provenance)."""
    from cost.engines import ENGINES
    return ", ".join(f"{name} {fit_status(hw, name)}" for name in ENGINES)


@quiet_broken_pipe
def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m hw_profiles", description=__doc__)
    p.add_argument("device", nargs="?", help="show one profile (name, alias or .json path)")
    p.add_argument("--json", action="store_true", help="one JSON list of the profiles on stdout")
    p.add_argument("--wide", action="store_true", help="every column: aliases, the engine fits' provenance")
    args = p.parse_args(argv)
    try:
        return show(args)
    except ProfileError as e:   # also a fitted engine section out of its range, found when first read
        print(f"error: {e}", file=sys.stderr)
        return 2


def show(args) -> int:
    profiles = [load_profile(args.device)] if args.device else [load_profile(n) for n in profile_names()]
    if args.json:
        print(dumps_strict([{
            "key": hw.key, "name": hw.name, "aliases": list(hw.aliases), "matrix_tflops": hw.matrix_tflops,
            "vector_tflops": hw.vector_tflops, "memory_bandwidth_gbps": hw.memory_bandwidth_gbps,
            "memory_capacity_gb": hw.memory_capacity_gb, "memory_usable_gib": hw.memory_bytes / 2**30,
            "memory_usable_stated": hw.memory_usable_stated,
            "interconnect_bandwidth_gbps": hw.interconnect_bandwidth_gbps,
            "scale_up_gpus": hw.scale_up_gpus, "gpus_per_node": hw.gpus_per_node, "vendor": hw.vendor,
            "host_link_bandwidth_gbps": hw.host_link_bandwidth_gbps, "l2_cache_mb": hw.l2_cache_mb,
            "efficiency_origin": hw.efficiency.origin,
            "price": {"usd_per_gpu_hour": hw.gpu_hour_usd, "origin": hw.price_origin} if hw.gpu_hour_usd else None,
            "topologies": {name: t.description for name, t in hw.topologies.items()},
            "power_limit": {"board_w": hw.board_w, "matrix_clock": hw.matrix_clock, "origin": hw.power_origin}
            if hw.power_origin else None,
            "engines": {name: {"origin": cal.origin, "inherited": cal.inherited_notes, "fit": fit_status(hw, name)}
                        for name, cal in _engines(hw).items()},
            "refused_engines": _refused(hw),
            "sources": hw.sources} for hw in profiles], indent=1))
        return 0
    rows = [[hw.key, *([hw.name, ", ".join(hw.aliases)] if args.wide else []),
             f"{hw.matrix_tflops.get('bf16', 0):g}",
             f"{hw.matrix_tflops['fp8']:g}" if "fp8" in hw.matrix_tflops else "-",
             f"{hw.memory_bandwidth_gbps / 1000:g}", f"{hw.memory_capacity_gb:g}",
             f"{hw.memory_bytes / 2**30:.2f}" + ("" if hw.memory_usable_stated else "*"),
             f"{hw.interconnect_bandwidth_gbps:g}", f"{hw.scale_up_gpus}", f"{hw.host_link_bandwidth_gbps:g}",
             f"{hw.gpu_hour_usd:g}" if hw.gpu_hour_usd else "-",
             *(["fitted" if hw.efficiency.origin.startswith("fitted") else "from h200"] if args.wide else []),
             _engine_summary(hw)] for hw in profiles]
    print(format_table(["key", *(["name", "aliases"] if args.wide else []), "bf16 TF/s", "fp8 TF/s", "HBM TB/s",
                        "GB", "usable GiB", "link GB/s", "domain", "host GB/s", "$/GPU-h",
                        *(["eager fit"] if args.wide else []), "engine kernels (fit per engine)"], rows,
                       title="dense matrix peaks (no sparsity); link: per direction; domain: GPUs one link domain "
                             "joins; GB: datasheet memory\nusable GiB: the total the driver reports, which engine "
                             f"budgets are taken of (*: not sourced, {USABLE_SHARE:g} of the datasheet's)\n"
                             "$/GPU-h: the profile's rent; engine kernels: fitted, or carried over from that profile; "
                             "--wide adds names, aliases and the eager fit"))
    others = [f"{hw.key}:{name}" for hw in profiles if not hw.topology for name in hw.topologies]
    if others and not args.device:
        print(f"\nother server topologies (--device NAME:TOPOLOGY): {', '.join(others)}")
    if args.device:
        hw = profiles[0]
        print(f"\nmatrix TFLOP/s: {_fmt(hw.matrix_tflops)}\nvector TFLOP/s: {_fmt(hw.vector_tflops)}")
        print(f"eager efficiency: {hw.efficiency.origin}")
        if hw.power_note:
            print(hw.power_note)
        print(f"price: ${hw.gpu_hour_usd:g} per GPU-hour ({hw.price_origin})" if hw.gpu_hour_usd
              else "price: none stated (give --gpu-hour-price to the serving CLIs)")
        if hw.topology:
            print(f"topology {hw.topology}: {hw.topologies[hw.topology].description}")
        else:
            for name, t in hw.topologies.items():
                print(f"other topology {hw.key}:{name}: {t.description}")
        for name, cal in _engines(hw).items():
            print(f"engine {name} ({fit_status(hw, name)}): {cal.origin}")
            for note in cal.inherited_notes:
                print(f"  {note}")
        for name, why in _refused(hw).items():
            print(f"engine {name}: refused: {why}")
        for field, source in hw.sources.items():
            print(f"source {field}: {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
