"""A device without kernel tables (MI300X, every AMD part) runs the engine kernel models of a donor device, scaled
by four physical quantities fitted on end-to-end serving runs (serving/calibrate_serving.py):

    compute fraction x matrix      (GEMM, MoE and prefill-attention compute, capped at the datasheet peak)
    tile sensitivity x narrow_tiles (how much slower narrow, small-batch GEMM tiles run: the matrix instruction's shape)
    memory fraction  x hbm         (weights, KV cache, activations: every streaming rate)
    fixed cost       + kernel_us   (every kernel's and every all-reduce's fixed cost)

The donor's fit keeps what tables measured (tile shapes, L2 behaviour, the relation between formats); the scaling
says how this device's matrix units, HBM and launches compare. Stored in a profile as
`"engines": {"from": DONOR, "serving_fit": {"params": {...}, ...}}`.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from .attention import DecodeAttentionParams, PrefillAttentionParams
from .calibration import EngineCalibration
from .collective import CollectiveCurve
from .gemm import GemmParams
from .moe import MoeParams
from .params import ParamSet, param
from .stream import StreamParams


@dataclass(frozen=True)
class DeviceScaling(ParamSet):
    matrix: float = param(1.0, 0.2, 1.5, "matrix throughput a large GEMM reaches on this device, relative to the "
                                         "donor's fitted fraction of its own peak (hipBLASLt vs cuBLAS)")
    hbm: float = param(1.0, 0.3, 1.5, "HBM bandwidth a weight- or KV-streaming kernel reaches, relative to the "
                                      "donor's fitted fraction of its own bandwidth")
    narrow_tiles: float = param(1.0, 0.0, 2.0, "efficiency loss of narrow (small-batch) GEMM tiles relative to "
                                               "the donor's: matrix instructions of another shape (MFMA 16x16 vs "
                                               "Hopper's 64-row WGMMA) waste less of a small tile")
    kernel_us: float = param(0.0, 0.0, 50.0, "fixed time per kernel beyond the donor's: launch inside a graph, "
                                             "ramp and tail (HIP graphs, Infinity Fabric all-reduce), us")


# parameter set -> (compute fractions, tile sensitivities, streaming rates, fixed costs): the fields each scales
SCALED_FIELDS: dict[type, tuple[tuple[str, ...], ...]] = {
    GemmParams: (("compute",), ("tile_sensitivity",), ("memory",), ("fixed_us",)),
    MoeParams: (("compute",), ("tile_sensitivity",), ("memory",), ("fixed_us",)),
    PrefillAttentionParams: (("compute",), (), ("memory", "write_memory"), ("fixed_us",)),
    DecodeAttentionParams: ((), (), ("memory", "unit_bandwidth_gbps"), ("fixed_us",)),
    StreamParams: ((), (), ("memory",), ("fixed_us",)),
    CollectiveCurve: ((), (), (), ("latency_us",)),
}


def scale_params(p: ParamSet, s: DeviceScaling) -> ParamSet:
    """One parameter set scaled; every value stays within its physical range (a compute fraction at most 1)."""
    compute, tiles, memory, fixed = SCALED_FIELDS[type(p)]
    bounds = {f.name: f.metadata["bounds"] for f in fields(p)}
    values = {}
    for names, op in ((compute, lambda v: v * s.matrix), (tiles, lambda v: v * s.narrow_tiles),
                      (memory, lambda v: v * s.hbm), (fixed, lambda v: v + s.kernel_us)):
        for n in names:
            lo, hi = bounds[n]
            values[n] = min(hi, max(lo, op(getattr(p, n))))
    return replace(p, **values)


def scale_calibration(cal: EngineCalibration, s: DeviceScaling, origin: str) -> EngineCalibration:
    """Every kernel model of `cal` scaled by `s`; `origin` says where the scaling comes from."""
    def each(d):
        return {k: scale_params(v, s) for k, v in d.items()}
    return replace(cal, origin=f"{cal.origin}, scaled to this device ({origin})",
                   gemm=each(cal.gemm), moe=each(cal.moe), prefill_attention=each(cal.prefill_attention),
                   decode_attention=each(cal.decode_attention),
                   quant=scale_params(cal.quant, s) if cal.quant else None,
                   elementwise=scale_params(cal.elementwise, s) if cal.elementwise else None,
                   allreduce={impl: each(curves) for impl, curves in cal.allreduce.items()},
                   releases={key: scale_calibration(older, s, origin) for key, older in cal.releases.items()})


def parse_serving_fit(data, where: str) -> tuple[DeviceScaling, str]:
    """A profile's `serving_fit` section: (the scaling, a one-line origin for notes)."""
    if not isinstance(data, dict) or not isinstance(data.get("params"), dict):
        raise ValueError(f"{where}: must be an object with 'params' ({', '.join(DeviceScaling.fitted_names())})")
    scaling = DeviceScaling.from_json(data["params"], f"{where}.params")
    origin = data.get("origin", "a serving fit")
    if not isinstance(origin, str):
        raise ValueError(f"{where}.origin: must be a string")
    return scaling, origin
