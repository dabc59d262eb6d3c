"""Helpers shared by the engine kernel models. Every model works on numpy arrays of calls (the
calibration prices a whole table at once) and equally on single calls (a model step)."""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Times:
    """Seconds per call and the parts it is made of, arrays (or scalars) of the same shape."""
    seconds: np.ndarray
    compute_s: np.ndarray
    memory_s: np.ndarray
    fixed_s: np.ndarray

    def scalar(self, i: int = 0) -> "Times":
        pick = lambda a: float(np.ravel(a)[i] if np.ndim(a) else a)  # noqa: E731
        return Times(pick(self.seconds), pick(self.compute_s), pick(self.memory_s), pick(self.fixed_s))


def soft_max(a, b, p):
    """(a^p + b^p)^(1/p): max(a, b) when p is large, a + b when p = 1; kernels overlap work partly."""
    hi = np.maximum(np.maximum(a, b), 1e-30)
    return hi * ((a / hi) ** p + (b / hi) ** p) ** (1.0 / p)


def arrays(*values):
    return [np.asarray(v, dtype=float) for v in values]


def release_key(release: str) -> tuple:
    """Order releases by their numbers ("0.9" < "0.17" < "1.2.0rc1")."""
    return tuple(int(x) for x in re.findall(r"\d+", release)) or (0,)


def release_series(release: str) -> str:
    """major.minor of a release or collector version ("1.0.0rc6" -> "1.0")."""
    parts = re.findall(r"\d+", release)
    return ".".join(parts[:2]) if len(parts) >= 2 else release
