"""The schema of a hardware profile file (hw_profiles/*.json): types, finite numbers, physical ranges.

pydantic v2 models, one per section; unknown fields are errors. `validate_profile(data, where)` returns the
validated `ProfileFile` or raises ProfileSchemaError whose message names the file, the field and the rule,
e.g. "hw_profiles/x.json: field 'efficiency.gemm.compute': must be <= 1 (got 1.5)".

The `engines` section is checked for its shape here ({"from": PROFILE}, or engine -> {"from": PROFILE} or
fitted parameter sets); the fitted numbers are checked by the parameter sets' own bounds
(cost/engine_kernels/params.py) when the engine is first used.
"""
from __future__ import annotations

import re
from dataclasses import fields as dataclass_fields
from typing import Annotated, Any

from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError,
                      field_validator, model_validator)

from .engines import ENGINES
from .power import PowerLimit


def fields_bounds(cls, name: str) -> tuple[float, float]:
    """A parameter set field's physical range (cost/engine_kernels/params.py), for the schema to check."""
    return next(f.metadata["bounds"] for f in dataclass_fields(cls) if f.name == name)


class ProfileSchemaError(ValueError):
    """A profile that breaks the schema."""


def _finite(low: float | None = None, high: float | None = None, *, gt: float | None = None):
    return Annotated[float, Field(strict=True, allow_inf_nan=False, ge=low, le=high, gt=gt)]


Fraction = _finite(high=1.0, gt=0.0)                 # efficiencies: a share of a peak, in (0, 1]
Microseconds = _finite(0.0, 1e6)                     # fixed latencies, >= 0
PositiveMicroseconds = _finite(high=1e6, gt=0.0)
Tflops = _finite(1e-6, 1e6)                          # ranges keep every derived time finite
GBps = _finite(1e-6, 1e7)
Tile = Annotated[int, Field(strict=True, ge=1, le=4096)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Memory(_Section):
    bandwidth_gbps: GBps
    capacity_gb: _finite(1e-3, 1e6)
    # what the driver reports as the device's total (torch.cuda.mem_get_info, PyTorch's "total capacity"), GiB:
    # the datasheet capacity less the memory the driver reserves; engines size their budgets on it
    usable_gib: _finite(1e-3, 1e6) | None = None

    @model_validator(mode="after")
    def _usable_within_capacity(self):
        if self.usable_gib is not None and self.usable_gib > self.capacity_gb:
            raise ValueError(f"usable_gib {self.usable_gib:g} exceeds capacity_gb {self.capacity_gb:g}")
        return self


class Link(_Section):
    name: StrictStr = ""
    bandwidth_gbps: GBps
    latency_us: PositiveMicroseconds
    # the scale-up domain: GPUs this link joins (NVLink through NVSwitch, Infinity Fabric, HCCS, UB); None: one
    # node (scale_out.gpus_per_node). An NVL72 rack joins 72 GPUs on NVLink across 18 hosts of 4.
    domain_gpus: Annotated[int, Field(strict=True, ge=1, le=10**5)] | None = None
    # False: the GPUs cannot map each other's memory (GeForce cards, a virtual machine that does not pass
    # peer-to-peer through, a platform whose P2P test fails). An engine's custom all-reduce needs it (vLLM
    # custom_all_reduce.py: "Custom allreduce is disabled because your platform lacks GPU P2P capability"), so NCCL
    # serves every message
    peer_to_peer: StrictBool = True


class ScaleOut(_Section):
    """The network between nodes, per GPU and direction."""
    name: StrictStr = ""
    gpus_per_node: Annotated[int, Field(strict=True, ge=1, le=10**5)]
    bandwidth_gbps: GBps
    latency_us: PositiveMicroseconds


class Price(_Section):
    """What one GPU of this kind rents for, by the hour: a list price on a date, with where it was read (prices
    vary two- to threefold by provider and term: the CLIs' --gpu-hour-price overrides it)."""
    gpu_hour_usd: _finite(high=1e4, gt=0.0)
    source: StrictStr = Field(min_length=1)
    date: StrictStr = Field(min_length=4)


class PowerLimitSchema(_Section):
    """A board power limit that holds the clock of dense matrix work below the datasheet's (cost/power.py)."""
    board_w: _finite(high=1e4, gt=0.0)              # this part's board power limit, W
    reference_board_w: _finite(high=1e4, gt=0.0)    # the limit of the device its kernel models were fitted on
    matrix_clock: _finite(*fields_bounds(PowerLimit, "matrix_clock"))
    origin: StrictStr = Field(min_length=1)         # sourced or fitted: the command, rows and date
    std_error: _finite(0.0, 10.0) | None = None
    source: dict[StrictStr, Any] = {}


class HostLink(_Section):
    name: StrictStr = ""
    bandwidth_gbps: GBps


class GemmEfficiencySchema(_Section):
    compute: Fraction
    memory: Fraction
    fixed_us: Microseconds
    tile_m: Tile = 128
    tile_n: Tile = 256
    smoothness: _finite(1.0, 64.0) = 3.0
    per_group_us: Microseconds = 0.0


class AttentionEfficiencySchema(_Section):
    compute: Fraction
    masked_compute: Fraction
    memory: Fraction
    fixed_us: Microseconds
    tile_q: Tile = 128
    tile_k: Tile = 128
    softmax_ops: _finite(0.0, 1e3) = 0.0
    masked_tile_q: Tile = 128
    masked_tile_k: Tile = 128


class StreamEfficiencySchema(_Section):
    memory: Fraction
    fixed_us: Microseconds
    broadcast_memory: Fraction = 0.5


class EfficiencySchema(_Section):
    origin: StrictStr = "fitted"
    gemm: GemmEfficiencySchema
    grouped_gemm: GemmEfficiencySchema
    attention: AttentionEfficiencySchema
    elementwise: StreamEfficiencySchema
    communication: Fraction
    eager_host_us: Microseconds = 25.0


class Inherited(_Section):
    """{"from": PROFILE}: take the section from another profile."""
    from_: StrictStr = Field(alias="from", min_length=1)


class InheritedEngines(Inherited):
    """{"from": PROFILE, "serving_fit": {...}}: another profile's engine models, optionally scaled by a fit on
    end-to-end serving runs (cost/engine_kernels/device_fit.py; its values are checked there)."""
    serving_fit: dict[StrictStr, Any] | None = None


class Topology(_Section):
    """A way the same GPUs may be joined in a server other than the one the engine curves were measured on."""
    description: StrictStr = Field(min_length=1)
    interconnect: Link
    allreduce: dict[StrictStr, dict[StrictStr, Any]] = Field(min_length=1)  # impl -> GPUs -> curve (checked later)

    @model_validator(mode="after")
    def _no_custom_all_reduce_without_peer_to_peer(self):
        if not self.interconnect.peer_to_peer and "custom" in self.allreduce:
            raise ValueError("a topology without peer_to_peer runs no custom all-reduce: give NCCL's curves only")
        return self


class ProfileFile(_Section):
    name: StrictStr = Field(min_length=1)
    aliases: list[StrictStr] = []
    vendor: StrictStr = ""
    compute_units: Annotated[int, Field(strict=True, ge=1, le=10**6)]
    matrix_tflops: dict[StrictStr, Tflops] = Field(min_length=1)
    vector_tflops: dict[StrictStr, Tflops] = Field(min_length=1)
    memory: Memory
    l2_cache_mb: _finite(0.0, 1e5) = 0.0
    interconnect: Link
    scale_out: ScaleOut | None = None        # the network between nodes: interconnect's fields and gpus_per_node
    price: Price | None = None               # rent per GPU-hour, with its source and date
    host_link: HostLink
    power_limit: PowerLimitSchema | None = None     # a power-capped part running a less capped part's kernel fits
    board_w: _finite(high=1e4, gt=0.0) | None = None    # the board power the part is rated and priced at, W
    kernel_launch_us: PositiveMicroseconds
    efficiency: dict[StrictStr, Any] | None = None     # Inherited or EfficiencySchema: checked in validate_profile
    engines: dict[StrictStr, Any] = {}                  # shape checked in validate_profile
    topologies: dict[StrictStr, Topology] = {}          # named alternatives: load as "DEVICE:TOPOLOGY"
    sources: dict[StrictStr, StrictStr] = {}

    @field_validator("vector_tflops")
    @classmethod
    def _fp32_vector(cls, rates: dict) -> dict:
        if "fp32" not in rates:   # the fallback rate of every vector op
            raise ValueError("must include fp32")
        return rates


def validation_message(e: ValidationError, where: str, prefix: str = "") -> str:
    err = e.errors()[0]
    loc = ".".join([*(prefix.split(".") if prefix else []), *(str(p) for p in err["loc"])])
    msg = re.sub(r"a valid dictionary( or instance of \w+)?", "an object", err["msg"])
    for old, new in (("Input should be ", "must be "), ("Value error, ", ""),
                     ("Extra inputs are not permitted", "unknown field"),
                     ("Field required", "missing")):
        msg = msg.replace(old, new)
    got = "" if err["type"] in ("missing", "extra_forbidden") or not err["loc"] else f" (got {err.get('input')!r})"
    if len(got) > 80:
        got = f" (got a {type(err.get('input')).__name__})"
    return f"{where}: field '{loc}': {msg}{got}" if loc else f"{where}: {msg}{got}"


def _validate(model: type[BaseModel], data, where: str, prefix: str = ""):
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ProfileSchemaError(validation_message(e, where, prefix)) from None


def validate_efficiency(data, where: str) -> Inherited | EfficiencySchema:
    if isinstance(data, dict) and "from" in data:
        return _validate(Inherited, data, where, "efficiency")
    return _validate(EfficiencySchema, data, where, "efficiency")


def validate_engines(data, where: str) -> None:
    """The engines section's shape; the parameter values are the parameter sets' to check."""
    if not isinstance(data, dict):
        raise ProfileSchemaError(f"{where}: field 'engines': must be an object")
    if "from" in data:
        _validate(InheritedEngines, data, where, "engines")
        return
    for name, body in data.items():
        if name not in ENGINES:
            raise ProfileSchemaError(f"{where}: field 'engines.{name}': unknown engine (choose from "
                                     f"{', '.join(ENGINES)})")
        if not isinstance(body, dict):
            raise ProfileSchemaError(f"{where}: field 'engines.{name}': must be an object")
        if "from" in body:
            _validate(InheritedEngines, body, where, f"engines.{name}")
        else:
            for section, value in body.items():
                if section not in ("origin", "release") and not isinstance(value, dict):
                    raise ProfileSchemaError(f"{where}: field 'engines.{name}.{section}': must be an object")


def validate_profile(data, where: str) -> ProfileFile:
    if not isinstance(data, dict):
        raise ProfileSchemaError(f"{where}: a profile is a JSON object")
    profile = _validate(ProfileFile, data, where)
    if profile.efficiency is not None:
        validate_efficiency(profile.efficiency, where)
    validate_engines(profile.engines, where)
    if profile.power_limit is not None and not _engines_carried(profile.engines):
        raise ProfileSchemaError(f"{where}: field 'power_limit': the engine kernels are fitted on this device's own "
                                 f"tables, which ran at its power limit; a power_limit applies only to kernel models "
                                 f"carried over (\"engines\": {{\"from\": ...}})")
    if profile.board_w is not None and profile.power_limit is not None:
        raise ProfileSchemaError(f"{where}: field 'board_w': the power_limit section states this part's board limit "
                                 f"(power_limit.board_w); give it once")
    return profile


def _engines_carried(engines: dict) -> bool:
    """Every engine's kernel models come from another profile (or the default sibling: no section)."""
    if not engines or "from" in engines:
        return True
    return all(isinstance(body, dict) and "from" in body for body in engines.values())


def profile_json_schema() -> dict:
    """The JSON Schema of a profile file (for editors and documentation)."""
    return ProfileFile.model_json_schema(by_alias=True)
