"""The schema of an HF-eager measurement folder (the input of python -m cost.calibrate DIR).

    scenarios.json      {"env": {...}, "scenarios": [{model, phase, batch, query, context, gpu_kernel_ms,
                         wall_ms, by_class_ms: {gemm, attention, elementwise, copy, reduce_index}, top_kernels_ms}]}
                        (an entry with "error" records a failed run and is skipped)
    microbench.json     {"env": {...}, "bf16_linear": [{m, k, n, s, ...}], "fp8_scaled_mm": [...],
                         "device_copy": [{bytes_moved, s, gbps}]}
    model_configs.json  {model name: HF config}

Every time is finite and >= 0 (kernel totals > 0), every count >= 1; unknown fields are errors. Errors name the
file, the field (with the entry's index) and the rule, and nothing is fitted or written.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from tracer.config_checks import check_model_config
from tracer.model_source import ModelError

from .profile_schema import validation_message

Ms = Annotated[float, Field(strict=True, ge=0.0, le=1e9, allow_inf_nan=False)]
PositiveS = Annotated[float, Field(strict=True, gt=0.0, le=1e6, allow_inf_nan=False)]
Count = Annotated[int, Field(strict=True, ge=1, le=10**8)]


class MeasurementError(ValueError):
    """A measurement file that breaks the schema."""


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ByClassMs(_Entry):
    gemm: Ms
    attention: Ms
    elementwise: Ms = 0.0
    copy_: Ms = Field(0.0, alias="copy")
    reduce_index: Ms = 0.0


class ScenarioEntry(_Entry):
    model: StrictStr
    phase: Literal["prefill", "decode"]
    batch: Count
    query: Count
    context: Annotated[int, Field(strict=True, ge=0, le=10**8)]
    gpu_kernel_ms: Annotated[float, Field(strict=True, gt=0.0, le=1e9, allow_inf_nan=False)]
    wall_ms: Ms = 0.0
    by_class_ms: ByClassMs
    top_kernels_ms: list[Any] = []


class ScenariosFile(_Entry):
    env: dict[str, Any] = {}
    scenarios: list[dict[str, Any]]


class LinearEntry(_Entry):
    m: Count
    k: Count
    n: Count
    s: PositiveS
    tflops: Ms = 0.0
    gbps: Ms = 0.0


class CopyEntry(_Entry):
    bytes_moved: Annotated[int, Field(strict=True, ge=1, le=10**15)]
    s: PositiveS
    gbps: Annotated[float, Field(strict=True, gt=0.0, le=1e7, allow_inf_nan=False)]


class MicrobenchFile(_Entry):
    env: dict[str, Any] = {}
    bf16_linear: list[LinearEntry] = []
    fp8_scaled_mm: list[LinearEntry] = []
    device_copy: list[CopyEntry] = []


def _read(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise MeasurementError(f"{path}: cannot read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise MeasurementError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except ValueError as e:
        raise MeasurementError(f"{path}: not valid JSON ({e})") from None


def _validate(model, data, where: str, prefix: str = ""):
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise MeasurementError(validation_message(e, where, prefix)) from None


def load_measurements(directory: Path) -> tuple[dict, list[dict], dict]:
    """(model configs, scenario dicts without the failed runs, microbench dict), every one validated."""
    configs = _read(directory / "model_configs.json")
    if not isinstance(configs, dict) or not all(isinstance(c, dict) for c in configs.values()):
        raise MeasurementError(f"{directory / 'model_configs.json'}: must map model names to config objects")
    for name, config in configs.items():
        try:
            check_model_config(config, f"{directory / 'model_configs.json'}: {name}")
        except ModelError as e:
            raise MeasurementError(str(e)) from None
    where = str(directory / "scenarios.json")
    raw = _validate(ScenariosFile, _read(directory / "scenarios.json"), where)
    scenarios = []
    for i, s in enumerate(raw.scenarios):
        if "error" in s:
            continue
        entry = _validate(ScenarioEntry, s, where, f"scenarios.{i}")
        if entry.model not in configs:
            raise MeasurementError(f"{where}: field 'scenarios.{i}.model': '{entry.model}' is not in "
                                   f"model_configs.json")
        scenarios.append(entry.model_dump(by_alias=True))
    micro = _validate(MicrobenchFile, _read(directory / "microbench.json"), str(directory / "microbench.json"))
    return configs, scenarios, micro.model_dump(by_alias=True)
