"""Where a result's numbers come from: the kernel models and the engine's step overheads.

A device's kernel models are fitted on its own published kernel tables or serving runs, or carried over from the
nearest fitted sibling its profile names (`engines.from`, `efficiency.from`). Every command puts `Origin.as_json()`
in its JSON and `Origin.headline()` in the first line of its text when the numbers are carried over.
"""
from __future__ import annotations

from dataclasses import dataclass

from .engines import DEFAULT_ENGINE, ENGINES
from .profile import HardwareProfile, load_profile


@dataclass(frozen=True)
class Origin:
    device: str                       # the profile's name
    engine: str | None                # None: HF eager (the profile's efficiency fit)
    kernels: str                      # the kernel models' origin, as the calibration states it
    fitted_on: str | None             # the profile whose own tables or runs the kernel models were fitted on
    kernels_engine: str | None        # the engine whose kernels they are (vLLM's when the device has none of `engine`)
    overheads: str | None = None      # the step overheads' origin (serving commands)
    scaled_on: tuple[str, ...] = ()   # profiles on the way whose serving-run fit scales the carried models
    power: str | None = None          # how the device's board power limit scales its matrix peaks (cost/power.py)

    @property
    def carried_over(self) -> bool:
        """The kernel numbers were not fitted on this device (or not for this engine)."""
        return self.fitted_on != self.device or self.kernels_engine != self.engine

    def headline(self) -> str | None:
        """One line for the top of a command's output, or None when the numbers are this device's own fit."""
        if not self.carried_over:
            return None
        what = f"{ENGINES[self.engine].label} kernel models" if self.engine else "HF eager kernel efficiencies"
        if self.fitted_on == self.device:    # this device's fit of another engine
            return (f"carried over: {what} on {self.device} are {ENGINES[self.kernels_engine].label}'s fit "
                    f"(no {ENGINES[self.engine].label} fit on this device)")
        source = self.fitted_on or "no fitted device"
        if self.engine and self.kernels_engine != self.engine:
            source = f"{ENGINES[self.kernels_engine].label}'s fit on {source}"
        scaled = f", scaled by the serving-run fit of {' and '.join(self.scaled_on)}" if self.scaled_on else ""
        return f"carried over: {what} on {self.device} are not fitted on it; they come from {source}{scaled}"

    def notes(self) -> list[str]:
        head = self.headline()
        out = [head] if head else []
        out.append(f"kernel numbers: {self.kernels}")
        if self.power:
            out.append(self.power)
        if self.overheads:
            out.append(f"step overheads: {self.overheads}")
        return out

    def as_json(self) -> dict:
        return {"device": self.device, "engine": self.engine, "carried_over": self.carried_over,
                "fitted_on": self.fitted_on, "kernels_engine": self.kernels_engine, "kernels": self.kernels,
                "scaled_on": list(self.scaled_on), "overheads": self.overheads, "headline": self.headline(),
                "power_limit": self.power}


def _engines_parent(hw: HardwareProfile, engine: str) -> str | None:
    """The profile `hw` takes `engine`'s kernel models from (its `engines` section), None when it fits them."""
    raw = hw.engines_data or ({"from": "h100"} if hw.key != "h100" else {})
    if "from" in raw:
        return raw["from"]
    body = raw.get(engine)
    if isinstance(body, dict) and "from" in body:
        return body["from"]
    return None


def kernels_fitted_on(hw: HardwareProfile, engine: str, seen: tuple = ()) \
        -> tuple[HardwareProfile | None, str, tuple[str, ...]]:
    """The profile whose own tables fitted the kernel models `hw` prices `engine` with, that engine (the default
    engine's, where neither `hw` nor its sibling has one of `engine`), and the profiles on the way whose serving-run
    fit (`serving_fit`) scales them."""
    parent = _engines_parent(hw, engine)
    if parent is None:
        raw = hw.engines_data or {}
        if engine in raw:
            return hw, engine, ()
        if DEFAULT_ENGINE in raw:
            return hw, DEFAULT_ENGINE, ()
        return None, engine, ()
    if parent in seen:
        return None, engine, ()
    raw = hw.engines_data or {}
    scaled = (hw.name,) if (raw.get("serving_fit") or (raw.get(engine) or {}).get("serving_fit")) else ()
    fitted, kernels_engine, more = kernels_fitted_on(load_profile(parent), engine, seen + (hw.key,))
    return fitted, kernels_engine, scaled + more


_ORIGINS: dict[tuple, Origin] = {}


def kernel_origin(hw: HardwareProfile, engine: str | None, overheads: str | None = None) -> Origin:
    """Where `hw`'s kernel numbers for `engine` (None: HF eager) come from (`overheads`: the step overheads')."""
    key = (hw.path or hw.key, hw.kernel_release, engine, overheads)
    if key not in _ORIGINS:
        _ORIGINS[key] = _kernel_origin(hw, engine, overheads)
    return _ORIGINS[key]


def _kernel_origin(hw: HardwareProfile, engine: str | None, overheads: str | None) -> Origin:
    if engine is None:
        eff = hw.efficiency
        # a named topology ("l40s:pcie-switch") renames the profile, not the device its fit was made on
        fitted = hw.name if eff.origin.startswith("fitted") else eff.fitted_on
        return Origin(hw.name, None, eff.origin, fitted or None, None, overheads, power=hw.power_note)
    cal = hw.engine(engine)
    fitted, kernels_engine, scaled = kernels_fitted_on(hw, engine)    # a topology keeps its profile's engines
    own = fitted is not None and fitted.key == hw.key
    fitted_name = None if fitted is None else (hw.name if own else fitted.name)
    if own and not cal.origin.startswith("fitted") and kernels_engine == engine:
        fitted_name = None    # a section of its own that is not a fit (defaults)
    return Origin(hw.name, engine, cal.origin, fitted_name, kernels_engine, overheads, scaled, hw.power_note)
