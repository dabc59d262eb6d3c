"""Hardware profiles: one JSON file per accelerator in hw_profiles/, every number with its source."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

from .engine_kernels import CollectiveCurve, EngineCalibration, parse_calibration
from .engine_kernels.device_fit import parse_serving_fit, scale_calibration
from .engines import DEFAULT_ENGINE, ENGINES, engine_refusal
from .power import POWER_CAP_LAW, capped_matrix_clock
from .profile_schema import ProfileFile, ProfileSchemaError, validate_efficiency, validate_profile


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
    fitted_on: str = ""     # the profile (name) whose measurements this fit was made on


# the reported total over the datasheet capacity (read as GiB) on the parts whose reports are sourced: H100 and A100
# 80GB 79.15-79.25 of 80, H200 139.80 of 141, B200 178.35 of 180
USABLE_SHARE = 0.99


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
    gpus_per_node: int = 8        # GPUs in one host (what --nodes counts)
    domain_gpus: int = 0          # GPUs the interconnect joins (scale-up domain); 0: one node
    scale_out_name: str = ""      # the network between nodes; empty: unknown, multi-node layouts are refused
    scale_out_bandwidth_gbps: float = 0.0    # per GPU, per direction
    scale_out_latency_us: float = 0.0
    engines_data: dict = field(default_factory=dict, compare=False, repr=False)   # the raw `engines` section
    topologies: dict = field(default_factory=dict, compare=False, repr=False)     # name -> schema Topology
    topology: str = ""            # the topology this profile was loaded with ("" : the measured one)
    peer_to_peer: bool = True     # the GPUs can map each other's memory (else no custom all-reduce runs)
    gpu_hour_usd: float = 0.0     # rent per GPU-hour (0: the profile states none)
    price_origin: str = ""        # its source and date
    # a board power limit binding harder (or less) than on the device the kernel models were fitted on (cost/power.py):
    # dense matrix work runs at this fraction of the datasheet clock, relative to the part the kernel models were
    # fitted on; 1: the same
    matrix_clock: float = 1.0
    board_w: float = 0.0          # the board power limit (0: unstated)
    power_origin: str = ""        # where matrix_clock comes from (sourced or fitted)
    memory_usable_gib: float = 0.0   # the total the driver reports (0: unstated, USABLE_SHARE of the datasheet's)
    kernel_release: str = ""      # the engine release whose kernels are priced ("": the newest fitted)

    @property
    def memory_bytes(self) -> float:
        """Device memory an engine can budget, in bytes: the total the driver reports to CUDA or HIP (what
        vLLM's gpu_memory_utilization, SGLang's mem_fraction_static and TensorRT-LLM's free fraction are taken
        of). It is less than the datasheet's: an H100 80GB has 81,559 MiB (nvidia-smi) of which the driver
        reserves about 470, so PyTorch reports 79.19 GiB. A profile that states no report takes USABLE_SHARE
        of its datasheet capacity read as GiB."""
        return (self.memory_usable_gib or self.memory_capacity_gb * USABLE_SHARE) * 2**30

    @property
    def memory_usable_stated(self) -> bool:
        return self.memory_usable_gib > 0

    @property
    def pcie_only(self) -> bool:
        """GPUs reach each other over PCIe alone (no NVLink, Infinity Fabric or HCCS)."""
        return self.interconnect_name.lower().startswith("pcie")

    @property
    def scale_up_gpus(self) -> int:
        """GPUs one scale-up domain (NVLink, Infinity Fabric, HCCS, UB) joins: collectives within it run on the
        interconnect, beyond it on the scale-out network. A node unless the profile names a larger domain (NVL72)."""
        return self.domain_gpus or self.gpus_per_node

    @property
    def l2_bytes(self) -> float:
        # vendors state cache sizes in binary megabytes (A100's "40 MB" L2 is 40 MiB); the tables agree: RTX PRO
        # 6000's decode kernels read a 127.9 MiB KV cache from its "128 MB" L2, 3x HBM's bandwidth
        return self.l2_cache_mb * 2**20

    def engine_calibrations(self, seen: tuple = ()) -> dict[str, EngineCalibration]:
        """Every engine's calibration on this device, inheritance resolved (parsed on first use)."""
        cached = _ENGINE_CACHE.get(self.path or self.key)
        if cached is None:
            raw = self.engines_data if self.engines_data else ({"from": "h100"} if self.key != "h100" else {})
            cached = _engines(raw, self.path or self.key, seen + (self.key,), self.vendor)
            if self.topology:
                cached = _with_allreduce(cached, self.topologies[self.topology], self.path)
            if not self.peer_to_peer:   # no custom all-reduce (it maps the other GPUs' buffers): NCCL only
                cached = {name: replace(cal, allreduce={impl: c for impl, c in cal.allreduce.items()
                                                        if impl != "custom"}) for name, cal in cached.items()}
            _ENGINE_CACHE[self.path or self.key] = cached
        return cached

    def engine(self, name: str = DEFAULT_ENGINE) -> EngineCalibration:
        """The engine's kernel models on this device (fitted, or inherited as its `origin` says)."""
        if name not in ENGINES:
            raise ProfileError(f"unknown engine '{name}' (choose from {', '.join(ENGINES)})")
        refusal = engine_refusal(name, self.vendor, self.name)
        if refusal:
            raise ProfileError(refusal)
        engines = self.engine_calibrations()
        if name in engines:
            return engines[name].at_release(self.kernel_release)
        if DEFAULT_ENGINE in engines:
            base = engines[DEFAULT_ENGINE]
            # the default engine's kernel models, not how it batches attention (its backend's, mixed_step_decodes)
            return EngineCalibration(**{**base.__dict__, "engine": name, "mixed_step_decodes": {},
                                        "origin": f"no {ENGINES[name].label} calibration for {self.name}: "
                                                  f"{ENGINES[DEFAULT_ENGINE].label}'s ({base.origin})"})
        raise ProfileError(f"{self.path or self.name}: no engine kernel calibration (add an 'engines' section "
                           f"or \"engines\": {{\"from\": \"h100\"}})")

    def at_engine_release(self, release: str | None) -> "HardwareProfile":
        """This device with the kernels an engine release ran, where its own tables were fitted
        (`engines.<engine>.releases`); the newest fit elsewhere."""
        return replace(self, kernel_release=release or "")

    def serving_fit_overheads(self, engine: str) -> tuple[dict, str] | None:
        """The engine overheads fitted together with this device's kernel scaling (`engines.serving_fit`: the engine
        on that cluster's hosts), as (ServingOverheads fields, origin); None when the fit holds none for `engine`."""
        fit = (self.engines_data or {}).get("serving_fit") or {}
        if fit.get("engine") == engine and isinstance(fit.get("overheads"), dict):
            return fit["overheads"], str(fit.get("origin", "a serving fit"))
        return None

    def matrix_peak(self, dtype: str) -> float:
        """FLOP/s the matrix units sustain for dtype: the datasheet peak at the clock a board power limit leaves
        dense matrix work (`matrix_clock`, 1 unless the profile has a `power_limit`); a dtype the chip lacks is an
        error, never zero."""
        if dtype not in self.matrix_tflops:
            raise ProfileError(f"{self.name} has no native {dtype} matrix support "
                               f"(supported: {', '.join(sorted(self.matrix_tflops))})")
        return self.matrix_tflops[dtype] * 1e12 * self.matrix_clock

    @property
    def power_note(self) -> str | None:
        """One line saying how the power limit enters the prices, None when the profile has none."""
        if self.matrix_clock >= 1.0 and not self.power_origin:
            return None
        return (f"power limit: dense matrix work on {self.name} priced at {self.matrix_clock:.3g} of the datasheet "
                f"clock, relative to the part its kernel models were fitted on ({self.board_w:g} W board limit; "
                f"{self.power_origin})")

    def vector_peak(self, dtype: str) -> float:
        return self.vector_tflops.get(dtype, self.vector_tflops.get("fp32", 1.0)) * 1e12

    @property
    def bandwidth(self) -> float:
        return self.memory_bandwidth_gbps * 1e9


def _with_allreduce(cals: dict[str, EngineCalibration], topology, where: str) -> dict[str, EngineCalibration]:
    """Every engine's all-reduce curves replaced, GPU count by GPU count, by the topology's."""
    curves = {}
    for impl, by_gpus in topology.allreduce.items():
        for n, curve in by_gpus.items():
            if not n.isdigit() or int(n) < 2:
                raise ProfileError(f"{where}: topology all-reduce '{impl}': GPU count '{n}' must be an integer >= 2")
            try:
                curves.setdefault(impl, {})[int(n)] = CollectiveCurve.from_json(curve, f"{where}.allreduce.{impl}.{n}")
            except ValueError as e:
                raise ProfileError(str(e)) from None
    return {name: replace(cal, allreduce={impl: {**cal.allreduce.get(impl, {}), **curves.get(impl, {})}
                                          for impl in {*cal.allreduce, *curves}})
            for name, cal in cals.items()}


def with_topology(profile: HardwareProfile, name: str) -> HardwareProfile:
    """The profile with one of its named topologies (another way of joining the same GPUs in a server)."""
    if profile.topology:
        raise ProfileError(f"{profile.key} already names its topology")
    if name not in profile.topologies:
        known = ", ".join(f"{profile.key}:{t}" for t in profile.topologies) or "none"
        raise ProfileError(f"{profile.key} has no topology '{name}' (has: {known})")
    t = profile.topologies[name]
    return replace(profile, key=f"{profile.key}:{name}", path=f"{profile.path}:{name}", topology=name,
                   name=f"{profile.name} ({name})", interconnect_name=t.interconnect.name,
                   interconnect_bandwidth_gbps=t.interconnect.bandwidth_gbps,
                   interconnect_latency_us=t.interconnect.latency_us,
                   peer_to_peer=t.interconnect.peer_to_peer,
                   domain_gpus=t.interconnect.domain_gpus if t.interconnect.domain_gpus is not None
                   else profile.domain_gpus)


def with_power_cap(profile: HardwareProfile, watts: float) -> HardwareProfile:
    """The profile with its board power capped at `watts` (`nvidia-smi -pl`, MLPerf's MaxQ systems): dense matrix
    work slows as cost/power.py `capped_matrix_clock` says; memory-bound kernels keep their clock."""
    if "@" in profile.key:
        raise ProfileError(f"{profile.key} already names its power cap")
    try:
        clock = capped_matrix_clock(profile.matrix_clock, profile.board_w, watts, profile.name)
    except ValueError as e:
        raise ProfileError(str(e)) from None
    # the law holds where the rated power binds dense matrix work; a part priced above the fitted part's clock
    # (matrix_clock > 1) is held by it less, so its cap costs at most what the law says
    loose = ("; this part's rated power binds its dense matrix work less than the fitted part's, so the law gives the "
             "most the cap can cost" if profile.matrix_clock > 1.0 else "")
    origin = (f"capped at {watts:g} W of its {profile.board_w:g} W: {POWER_CAP_LAW}{loose}"
              + (f"; uncapped: {profile.power_origin}" if profile.power_origin else ""))
    return replace(profile, key=f"{profile.key}@{watts:g}W", path=f"{profile.path}@{watts:g}W",
                   name=f"{profile.name} at {watts:g} W", matrix_clock=clock, board_w=watts, power_origin=origin)


def engine_kernel_releases(engine: str) -> list[str]:
    """The older releases (major.minor) of `engine` whose kernel tables some bundled profile has fitted
    (`engines.<engine>.releases`)."""
    found = set()
    for path in profiles_dir().glob("*.json"):
        try:
            section = json.loads(path.read_text()).get("engines", {}).get(engine, {})
        except (OSError, ValueError):
            continue
        if isinstance(section, dict) and isinstance(section.get("releases"), dict):
            found |= set(section["releases"])
    return sorted(found)


def profiles_dir() -> Path:
    return Path(str(resources.files("hw_profiles")))


def _efficiency(eff: dict | None, where: str, seen: tuple = (), name: str = "") -> Efficiency:
    if eff is None or "from" in eff:
        base = (eff or {}).get("from", "h200")
        if base in seen:
            raise ProfileError(f"{where}: efficiency 'from' loops through {base}")
        parent = load_profile(base, seen + (base,))
        return Efficiency(**{**parent.efficiency.__dict__, "origin": f"carried over from the {parent.name} fit"})
        # (fitted_on stays the parent's: the device the numbers were measured on)
    e = validate_efficiency(eff, where)
    return Efficiency(gemm=GemmEfficiency(**e.gemm.model_dump()),
                      grouped_gemm=GemmEfficiency(**e.grouped_gemm.model_dump()),
                      attention=AttentionEfficiency(**e.attention.model_dump()),
                      elementwise=StreamEfficiency(**e.elementwise.model_dump()),
                      communication=e.communication, origin=e.origin, eager_host_us=e.eager_host_us, fitted_on=name)


def _engines(raw, where: str, seen: tuple, vendor: str) -> dict[str, EngineCalibration]:
    """The `engines` section: fitted calibrations, or `{"from": PROFILE}` (whole section or one engine) to inherit.
    A fitted calibration lacking a section takes it from the device's default engine, and says so."""
    if not isinstance(raw, dict):
        raise ProfileError(f"{where}: field 'engines' must be an object")
    if "from" in raw:
        parent = _parent(raw["from"], where, "engines", seen)
        return {name: _scaled(_inherit(cal, parent, vendor), raw, where, "engines")
                for name, cal in parent.engine_calibrations(seen).items()}
    out: dict[str, EngineCalibration] = {}
    for name, body in raw.items():
        if name not in ENGINES:
            raise ProfileError(f"{where}: unknown engine 'engines.{name}' (choose from {', '.join(ENGINES)})")
        if not isinstance(body, dict):
            raise ProfileError(f"{where}: field 'engines.{name}' must be an object")
        if "from" in body:
            parent = _parent(body["from"], where, f"engines.{name}", seen)
            out[name] = _scaled(_inherit(parent.engine(name), parent, vendor), body, where, f"engines.{name}")
            continue
        try:
            out[name] = parse_calibration(name, body, f"engines.{name}")
        except ValueError as e:
            raise ProfileError(f"{where}: {e}") from None
    own = dict(out)
    for name, cal in own.items():
        if cal.carried:
            out[name] = _with_carried(cal, name, where, seen, own)
    default = out.get(DEFAULT_ENGINE)
    for name, cal in out.items():
        if default is not None and name != DEFAULT_ENGINE:
            out[name] = cal.merged_over(default, f"this device's {DEFAULT_ENGINE} fit")
    return out


def _with_carried(cal: EngineCalibration, engine: str, where: str, seen: tuple,
                  own: dict[str, EngineCalibration]) -> EngineCalibration:
    """Each format the section carries, where it has none: from a sibling device's fit of the same engine, or
    (`"engine"`) from another engine's fit, on this device (`own`, this profile's fitted sections) or a sibling."""
    for key, spec in cal.carried.items():
        section, fmt = key.split(".", 1)
        if fmt in getattr(cal, section):
            continue
        field_name = f"engines.{engine}.carried.{key}"
        source_engine = spec.get("engine", engine)
        if spec["from"] == (seen[-1] if seen else None):
            if source_engine == engine:
                raise ProfileError(f"{where}: {field_name}: a format cannot be carried from its own section")
            if source_engine not in own:
                raise ProfileError(f"{where}: {field_name}: this profile has no fitted {source_engine} section to "
                                   f"take it from")
            source, label = own[source_engine], f"this device's {source_engine} fit"
        else:
            parent = _parent(spec["from"], where, field_name, seen)
            source = parent.engine(source_engine)
            label = f"the {parent.name} " + (f"{source_engine} fit" if source_engine != engine else "fit")
        theirs = getattr(source, section).get(fmt)
        if theirs is None:
            raise ProfileError(f"{where}: {field_name}: {spec['from']} has no {key} for {source_engine}")
        cal = cal.with_format(key, theirs, f"{label} ({spec['why']})")
    return cal


def _parent(name, where: str, field_name: str, seen: tuple) -> "HardwareProfile":
    if not isinstance(name, str):
        raise ProfileError(f"{where}: field '{field_name}.from' must be a profile name")
    if name in seen:
        raise ProfileError(f"{where}: '{field_name}.from' loops through {name}")
    return load_profile(name)


def _scaled(cal: EngineCalibration, raw: dict, where: str, field_name: str) -> EngineCalibration:
    """An inherited calibration scaled by the section's `serving_fit`, if it has one."""
    if raw.get("serving_fit") is None:
        return cal
    try:
        scaling, origin = parse_serving_fit(raw["serving_fit"], f"{field_name}.serving_fit")
    except ValueError as e:
        raise ProfileError(f"{where}: {e}") from None
    return scale_calibration(cal, scaling, origin)


def _inherit(cal: EngineCalibration, parent: "HardwareProfile", vendor: str) -> EngineCalibration:
    """The parent's calibration, its origin naming the parent (and, when the parent carries it too, where from).
    A part of another vendor takes the parent's kernel models, not how the engine batches attention there: that
    is the backend the engine picks on the parent's GPUs (mixed_step_decodes: vLLM's FlashAttention on NVIDIA)."""
    origin = (f"carried over from the {parent.name} profile, which has it {cal.origin}"
              if cal.origin.startswith("carried over") else f"carried over from the {parent.name} fit")
    backend = cal.mixed_step_decodes if parent.vendor == vendor else {}
    return EngineCalibration(**{**cal.__dict__, "origin": origin, "mixed_step_decodes": backend})


def parse_profile(data: dict, key: str, where: str, seen: tuple = ()) -> HardwareProfile:
    """A profile's JSON, validated against the schema (cost/profile_schema.py), as a HardwareProfile."""
    try:
        f = validate_profile(data, where)
    except ProfileSchemaError as e:
        raise ProfileError(str(e)) from None
    return HardwareProfile(
        key=key, name=f.name, aliases=tuple(f.aliases), vendor=f.vendor, compute_units=f.compute_units,
        matrix_tflops=dict(f.matrix_tflops), vector_tflops=dict(f.vector_tflops),
        memory_bandwidth_gbps=f.memory.bandwidth_gbps, memory_capacity_gb=f.memory.capacity_gb,
        memory_usable_gib=f.memory.usable_gib or 0.0,
        interconnect_name=f.interconnect.name, interconnect_bandwidth_gbps=f.interconnect.bandwidth_gbps,
        interconnect_latency_us=f.interconnect.latency_us, peer_to_peer=f.interconnect.peer_to_peer,
        host_link_name=f.host_link.name,
        host_link_bandwidth_gbps=f.host_link.bandwidth_gbps, kernel_launch_us=f.kernel_launch_us,
        efficiency=_efficiency(f.efficiency, where, seen, f.name), sources=dict(f.sources), path=where,
        l2_cache_mb=f.l2_cache_mb, engines_data=f.engines, topologies=dict(f.topologies),
        domain_gpus=f.interconnect.domain_gpus or 0, **_scale_out(f),
        **({"gpu_hour_usd": f.price.gpu_hour_usd, "price_origin": f"{f.price.source}, {f.price.date}"}
           if f.price else {}),
        **({"matrix_clock": f.power_limit.matrix_clock, "board_w": f.power_limit.board_w,
            "power_origin": f.power_limit.origin} if f.power_limit else {"board_w": f.board_w or 0.0}))


def _scale_out(f: ProfileFile) -> dict:
    """The optional `scale_out` section: how nodes are joined, per GPU."""
    if f.scale_out is None:
        return {}
    return {"scale_out_name": f.scale_out.name, "gpus_per_node": f.scale_out.gpus_per_node,
            "scale_out_bandwidth_gbps": f.scale_out.bandwidth_gbps, "scale_out_latency_us": f.scale_out.latency_us}


def _bundled_keys() -> dict[str, str]:
    """alias -> file key for every bundled profile."""
    keys = {}
    for path in sorted(profiles_dir().glob("*.json")):
        keys[path.stem.lower()] = path.stem
        try:
            for alias in json.loads(path.read_text(encoding="utf-8")).get("aliases", []):
                keys[alias.lower()] = path.stem
        except (OSError, ValueError, AttributeError, TypeError):
            continue   # a broken bundled profile is reported when it is loaded by name
    return keys


def profile_names() -> list[str]:
    return sorted(p.stem for p in profiles_dir().glob("*.json"))


_CACHE: dict[str, HardwareProfile] = {}
_POWER_CAP = re.compile(r"(?P<base>[^@]+)@(?P<watts>\d+(?:\.\d+)?)[wW]")      # "h200@500W": a board power cap
_ENGINE_CACHE: dict[str, dict[str, EngineCalibration]] = {}


def split_device(device: str) -> tuple[str, str, float | None]:
    """DEVICE[:TOPOLOGY][@WATTSW] as (DEVICE, TOPOLOGY or "", the cap's watts or None); a profile file's path is
    a device of its own."""
    if Path(device).is_file():
        return device, "", None
    watts = None
    if "@" in device:
        capped = _POWER_CAP.fullmatch(device)
        if capped is None:
            raise ProfileError(f"'{device}': a board power cap is written DEVICE[:TOPOLOGY]@WATTSW, as in h200@500W "
                               f"or h100:hgx4@600W")
        device, watts = capped["base"], float(capped["watts"])
    base, _, topology = device.rpartition(":") if ":" in device and not Path(device).is_file() else (device, "", "")
    return base, topology, watts


def with_device_suffixes(profile: HardwareProfile, device: str) -> HardwareProfile:
    """`profile` (a calibration's candidate) joined and capped as a run's device name says: its topology, unless
    the candidate names one already, and its board power cap."""
    _, topology, watts = split_device(device)
    if topology and not profile.topology:
        profile = with_topology(profile, topology)
    return with_power_cap(profile, watts) if watts is not None else profile


def load_profile(device: str, seen: tuple = ()) -> HardwareProfile:
    """A bundled profile by name or alias (case-insensitive), or a path to a profile JSON; "NAME:TOPOLOGY"
    takes one of its named topologies, "NAME@WATTSW" a board power cap."""
    if device in _CACHE:
        return _CACHE[device]
    base, topology, watts = split_device(device)
    if topology or watts is not None:
        profile = load_profile(base, seen)
        profile = with_topology(profile, topology) if topology else profile   # refuses a second topology
        _CACHE[device] = with_power_cap(profile, watts) if watts is not None else profile
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
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ProfileError(f"{where}: cannot read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise ProfileError(f"{where}: not UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ProfileError(f"{where}: not valid JSON ({e})") from None
    profile = parse_profile(data, key, where, seen)
    _CACHE[device] = profile
    return profile
