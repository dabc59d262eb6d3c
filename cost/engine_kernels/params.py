"""Fitted parameter sets of the engine kernel models: typed, bounded, and read from / written to profiles.

Every field of a parameter set is one physical quantity with a unit and a physical range. The range
bounds the calibration fit and validates a profile: a profile value outside it is an error that
names the field, never a silently odd number.
"""
from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields, replace

import numpy as np


def param(default: float, low: float, high: float, doc: str, *, fitted: bool = True, grid: tuple = (),
          starts: tuple = ()):
    """A model parameter: its default, physical range and meaning; `fitted=False` marks fixed data (tile sizes).
    `grid`: values to try for a parameter the time depends on in steps (a wave count), where gradients vanish;
    `starts`: values to start a fit from, where the loss has more than one valley."""
    return field(default=default, metadata={"bounds": (low, high), "doc": doc, "fitted": fitted, "grid": grid,
                                            "starts": starts})


@dataclass(frozen=True)
class ParamSet:
    """Base of every parameter set: conversion to and from fit vectors and profile JSON."""

    @classmethod
    def fitted_names(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.metadata.get("fitted", True)]

    def defaults_keeping_data(self) -> "ParamSet":
        """The default fitted values with this set's kernel data (tile shapes: fields not fitted) kept."""
        return type(self)(**{f.name: getattr(self, f.name) for f in fields(self) if not f.metadata.get("fitted", True)})

    @classmethod
    def grids(cls) -> dict[str, tuple]:
        return {f.name: f.metadata["grid"] for f in fields(cls) if f.metadata.get("grid")}

    @classmethod
    def starts(cls) -> dict[str, tuple]:
        return {f.name: f.metadata["starts"] for f in fields(cls) if f.metadata.get("starts")}

    @classmethod
    def bounds(cls) -> tuple[np.ndarray, np.ndarray]:
        spec = {f.name: f.metadata["bounds"] for f in fields(cls)}
        names = cls.fitted_names()
        return (np.array([spec[n][0] for n in names], float), np.array([spec[n][1] for n in names], float))

    def vector(self) -> np.ndarray:
        return np.array([getattr(self, n) for n in self.fitted_names()], float)

    def with_vector(self, x) -> "ParamSet":
        return replace(self, **{n: float(v) for n, v in zip(self.fitted_names(), x)})

    @classmethod
    def from_json(cls, data, where: str) -> "ParamSet":
        if not isinstance(data, dict):
            raise ValueError(f"{where}: must be an object of {cls.__name__} fields")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ValueError(f"{where}: unknown field '{unknown[0]}' (fields: {', '.join(known)})")
        values = {}
        for name, f in known.items():
            if name not in data:
                if f.default is MISSING:
                    raise ValueError(f"{where}: missing field '{name}'")
                continue
            value = data[name]
            low, high = f.metadata["bounds"]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{where}.{name}: must be a finite number, got {value!r}")
            if not low <= value <= high:
                raise ValueError(f"{where}.{name}: {value} is outside its physical range [{low:g}, {high:g}]")
            values[name] = type(f.default)(value) if isinstance(f.default, int) else float(value)
        return cls(**values)

    def to_json(self) -> dict:
        return {f.name: (round(getattr(self, f.name), 4) if isinstance(getattr(self, f.name), float)
                         else getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def describe(cls) -> dict[str, str]:
        return {f.name: f.metadata["doc"] for f in fields(cls)}
