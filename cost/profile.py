"""Hardware profiles: one JSON file per accelerator in hw_profiles/, every number with its source."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from .engine_kernels import EngineCalibration, parse_calibration
from .engines import DEFAULT_ENGINE, ENGINES


class ProfileError(ValueError):
    """A profile that cannot be found or is malformed; the message names the field."""


@dataclass(frozen=True)
class GemmEfficiency:
    compute: float          # fraction of the datasheet matrix peak a large GEMM reaches
    memory: float           # fraction of the datasheet bandwidth a weight-streaming GEMM reaches
    fixed_us: float         # per-kernel ramp/tail latency
    tile_m: int = 128
    tile_n: int = 256
    smoothness: float = 3.0  # p of the soft roofline max (t_c^p + t_m^p)^(1/p)
    per_group_us: float = 0.0  # grouped GEMMs: scheduling cost per active group (expert)


@dataclass(frozen=True)
class AttentionEfficiency:
    compute: float          # flash attention, fraction of matrix peak per busy compute unit
    masked_compute: float   # eager prefill over a cached prefix (SDPA with an explicit bias)
    memory: float           # decode: fraction of bandwidth reading the KV cache
    fixed_us: float
    tile_q: int = 128
    tile_k: int = 128
    softmax_ops: float = 0.0
    masked_tile_q: int = 128  # the eager prefix path's kernel (FlashAttention-2 through SDPA with a bias)
    masked_tile_k: int = 128  # vector ops per score (exp, max, sum, scale): costs the same for any head dim


@dataclass(frozen=True)
class StreamEfficiency:
    memory: float           # elementwise / copy / reduction kernels
    fixed_us: float
    broadcast_memory: float = 0.5  # elementwise kernels with a broadcast input (no vectorized path)


@dataclass(frozen=True)
class Efficiency:
    gemm: GemmEfficiency
    grouped_gemm: GemmEfficiency
    attention: AttentionEfficiency
    elementwise: StreamEfficiency
    communication: float    # fraction of interconnect bandwidth a collective reaches
    origin: str             # "fitted on ..." or "carried over from ..."
    eager_host_us: float = 25.0  # host time per launched op in HF eager (Python dispatch + launch)


@dataclass(frozen=True)
class HardwareProfile:
    key: str
    name: str
    aliases: tuple[str, ...]
    vendor: str
    compute_units: int
    matrix_tflops: dict[str, float]
    vector_tflops: dict[str, float]
    memory_bandwidth_gbps: float
    memory_capacity_gb: float
    interconnect_name: str
    interconnect_bandwidth_gbps: float
    interconnect_latency_us: float
    host_link_name: str
    host_link_bandwidth_gbps: float
    kernel_launch_us: float
    efficiency: Efficiency
    sources: dict[str, str] = field(default_factory=dict)
    path: str = ""
    l2_cache_mb: float = 0.0      # 0: unknown, no L2 residency modelled
    gpus_per_node: int = 8        # GPUs one interconnect domain (NVLink, Infinity Fabric, HCCS) joins
    scale_out_name: str = ""      # the network between nodes; empty: unknown, multi-node layouts are refused
    scale_out_bandwidth_gbps: float = 0.0    # per GPU, per direction
    scale_out_latency_us: float = 0.0
    engines_data: dict = field(default_factory=dict, compare=False, repr=False)   # the raw `engines` section

    @property
    def memory_bytes(self) -> float:
        """Device memory in bytes. Datasheet capacities ("80 GB", "141 GB") are binary: an H100 80GB reports
        81,559 MiB and an H200 143,771 MiB in nvidia-smi, so a datasheet GB is taken as GiB."""
        return self.memory_capacity_gb * 2**30

    @property
    def l2_bytes(self) -> float:
        return self.l2_cache_mb * 1e6

    def engine_calibrations(self, seen: tuple = ()) -> dict[str, EngineCalibration]:
        """Every engine's calibration on this device, inheritance resolved (parsed on first use)."""
        cached = _ENGINE_CACHE.get(self.path or self.key)
        if cached is None:
            raw = self.engines_data if self.engines_data else ({"from": "h100"} if self.key != "h100" else {})
            cached = _engines(raw, self.path or self.key, seen + (self.key,))
            _ENGINE_CACHE[self.path or self.key] = cached
        return cached

    def engine(self, name: str = DEFAULT_ENGINE) -> EngineCalibration:
        """The engine's kernel models on this device (fitted, or inherited as its `origin` says)."""
        if name not in ENGINES:
            raise ProfileError(f"unknown engine '{name}' (choose from {', '.join(ENGINES)})")
        engines = self.engine_calibrations()
        if name in engines:
            return engines[name]
        if DEFAULT_ENGINE in engines:
            base = engines[DEFAULT_ENGINE]
            return EngineCalibration(**{**base.__dict__, "engine": name,
                                        "origin": f"no {ENGINES[name].label} calibration for {self.name}: "
                                                  f"{ENGINES[DEFAULT_ENGINE].label}'s ({base.origin})"})
        raise ProfileError(f"{self.path or self.name}: no engine kernel calibration (add an 'engines' section "
                           f"or \"engines\": {{\"from\": \"h100\"}})")

    def matrix_peak(self, dtype: str) -> float:
        """FLOP/s of the matrix units for dtype; a dtype the chip lacks is an error, never zero."""
        if dtype not in self.matrix_tflops:
            raise ProfileError(f"{self.name} has no native {dtype} matrix support "
                               f"(supported: {', '.join(sorted(self.matrix_tflops))})")
        return self.matrix_tflops[dtype] * 1e12

    def vector_peak(self, dtype: str) -> float:
        return self.vector_tflops.get(dtype, self.vector_tflops.get("fp32", 1.0)) * 1e12

    @property
    def bandwidth(self) -> float:
        return self.memory_bandwidth_gbps * 1e9


def profiles_dir() -> Path:
    return Path(str(resources.files("hw_profiles")))


def _require(data: dict, path: str, kind: type, where: str):
    value = data
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            raise ProfileError(f"{where}: missing field '{path}'")
        value = value[part]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is float and value <= 0):
        raise ProfileError(f"{where}: field '{path}' must be a positive number" if kind is float
                           else f"{where}: field '{path}' must be a {kind.__name__}")
    return value


def _rates(data: dict, name: str, where: str) -> dict[str, float]:
    rates = _require(data, name, dict, where)
    for dtype, value in rates.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise ProfileError(f"{where}: field '{name}.{dtype}' must be a positive number")
    return {k: float(v) for k, v in rates.items()}


def _efficiency(data: dict, where: str, seen: tuple = ()) -> Efficiency:
    eff = data.get("efficiency")
    if eff is None or "from" in eff:
        base = (eff or {}).get("from", "h200")
        if base in seen:
            raise ProfileError(f"{where}: efficiency 'from' loops through {base}")
        parent = load_profile(base, seen + (base,))
        return Efficiency(**{**parent.efficiency.__dict__, "origin": f"carried over from the {parent.name} fit"})

    def section(name, cls):
        body = _require(eff, name, dict, where)
        try:
            return cls(**body)
        except TypeError as e:
            raise ProfileError(f"{where}: field 'efficiency.{name}': {e}") from None

    return Efficiency(gemm=section("gemm", GemmEfficiency), grouped_gemm=section("grouped_gemm", GemmEfficiency),
                      attention=section("attention", AttentionEfficiency),
                      elementwise=section("elementwise", StreamEfficiency),
                      communication=_require(eff, "communication", float, where),
                      origin=eff.get("origin", "fitted"), eager_host_us=float(eff.get("eager_host_us", 25.0)))


def _engines(raw, where: str, seen: tuple) -> dict[str, EngineCalibration]:
    """The `engines` section: fitted calibrations, or `{"from": PROFILE}` (whole section or one engine) to inherit.
    A fitted calibration lacking a section takes it from the device's default engine, and says so."""
    if not isinstance(raw, dict):
        raise ProfileError(f"{where}: field 'engines' must be an object")
    if "from" in raw:
        parent = _parent(raw["from"], where, "engines", seen)
        return {name: _inherit(cal, parent) for name, cal in parent.engine_calibrations(seen).items()}
    out: dict[str, EngineCalibration] = {}
    for name, body in raw.items():
        if name not in ENGINES:
            raise ProfileError(f"{where}: unknown engine 'engines.{name}' (choose from {', '.join(ENGINES)})")
        if not isinstance(body, dict):
            raise ProfileError(f"{where}: field 'engines.{name}' must be an object")
        if "from" in body:
            parent = _parent(body["from"], where, f"engines.{name}", seen)
            out[name] = _inherit(parent.engine(name), parent)
            continue
        try:
            out[name] = parse_calibration(name, body, f"engines.{name}")
        except ValueError as e:
            raise ProfileError(f"{where}: {e}") from None
    default = out.get(DEFAULT_ENGINE)
    for name, cal in out.items():
        if default is not None and name != DEFAULT_ENGINE:
            out[name] = cal.merged_over(default, f"this device's {DEFAULT_ENGINE} fit")
    return out


def _parent(name, where: str, field_name: str, seen: tuple) -> "HardwareProfile":
    if not isinstance(name, str):
        raise ProfileError(f"{where}: field '{field_name}.from' must be a profile name")
    if name in seen:
        raise ProfileError(f"{where}: '{field_name}.from' loops through {name}")
    return load_profile(name)


def _inherit(cal: EngineCalibration, parent: "HardwareProfile") -> EngineCalibration:
    origin = cal.origin if cal.origin.startswith("carried over") else f"carried over from the {parent.name} fit"
    return EngineCalibration(**{**cal.__dict__, "origin": origin})


def parse_profile(data: dict, key: str, where: str, seen: tuple = ()) -> HardwareProfile:
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: a profile is a JSON object")
    l2 = data.get("l2_cache_mb", 0.0)
    if isinstance(l2, bool) or not isinstance(l2, (int, float)) or not 0 <= l2 < 1e5:
        raise ProfileError(f"{where}: field 'l2_cache_mb' must be a number of MB >= 0")
    return HardwareProfile(
        key=key, name=_require(data, "name", str, where), aliases=tuple(data.get("aliases", [])),
        vendor=data.get("vendor", ""), compute_units=int(_require(data, "compute_units", int, where)),
        matrix_tflops=_rates(data, "matrix_tflops", where), vector_tflops=_rates(data, "vector_tflops", where),
        memory_bandwidth_gbps=_require(data, "memory.bandwidth_gbps", float, where),
        memory_capacity_gb=_require(data, "memory.capacity_gb", float, where),
        interconnect_name=data.get("interconnect", {}).get("name", ""),
        interconnect_bandwidth_gbps=_require(data, "interconnect.bandwidth_gbps", float, where),
        interconnect_latency_us=_require(data, "interconnect.latency_us", float, where),
        host_link_name=data.get("host_link", {}).get("name", ""),
        host_link_bandwidth_gbps=_require(data, "host_link.bandwidth_gbps", float, where),
        kernel_launch_us=_require(data, "kernel_launch_us", float, where),
        efficiency=_efficiency(data, where, seen), sources=data.get("sources", {}), path=where,
        l2_cache_mb=float(l2), engines_data=data.get("engines", {}), **_scale_out(data, where))


def _scale_out(data: dict, where: str) -> dict:
    """The optional `scale_out` section: how nodes are joined, per GPU."""
    raw = data.get("scale_out")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ProfileError(f"{where}: 'scale_out' must be an object with gpus_per_node, bandwidth_gbps, latency_us")
    out = {"scale_out_name": str(raw.get("name", ""))}
    for key, field_name, kind in (("gpus_per_node", "gpus_per_node", int),
                                  ("bandwidth_gbps", "scale_out_bandwidth_gbps", float),
                                  ("latency_us", "scale_out_latency_us", float)):
        value = raw.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e6 or \
                (kind is int and value != int(value)):
            raise ProfileError(f"{where}: field 'scale_out.{key}' must be a positive {kind.__name__}")
        out[field_name] = kind(value)
    return out


def _bundled_keys() -> dict[str, str]:
    """alias -> file key for every bundled profile."""
    keys = {}
    for path in sorted(profiles_dir().glob("*.json")):
        keys[path.stem.lower()] = path.stem
        try:
            for alias in json.loads(path.read_text()).get("aliases", []):
                keys[alias.lower()] = path.stem
        except json.JSONDecodeError:
            continue
    return keys


def profile_names() -> list[str]:
    return sorted(p.stem for p in profiles_dir().glob("*.json"))


_CACHE: dict[str, HardwareProfile] = {}
_ENGINE_CACHE: dict[str, dict[str, EngineCalibration]] = {}


def load_profile(device: str, seen: tuple = ()) -> HardwareProfile:
    """A bundled profile by name or alias (case-insensitive), or a path to a profile JSON."""
    if device in _CACHE:
        return _CACHE[device]
    path = Path(device).expanduser()
    if device.endswith(".json") or path.is_file():
        if not path.is_file():
            raise ProfileError(f"profile file {device} not found")
        key, where = path.stem, str(path)
    else:
        keys = _bundled_keys()
        if device.lower() not in keys:
            raise ProfileError(f"unknown device '{device}' (bundled: {', '.join(profile_names())}; "
                               f"or pass a profile .json path)")
        key = keys[device.lower()]
        path = profiles_dir() / f"{key}.json"
        where = f"hw_profiles/{key}.json"
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ProfileError(f"{where}: not valid JSON ({e})") from None
    profile = parse_profile(data, key, where, seen)
    _CACHE[device] = profile
    return profile
