"""All-reduce as the engines run it: NCCL, or the engine's custom (one-shot / two-shot) all-reduce.

A curve per GPU count, fitted to measured message sizes:

    time = latency + ramp x bytes / (bytes + ramp_bytes) + bytes x 2(n-1)/n / bus bandwidth

The ramp is the protocol change from latency-bound small messages to bandwidth-bound large ones.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .common import Times, arrays
from .params import ParamSet, param

IMPLEMENTATIONS = ("custom", "nccl")


@dataclass(frozen=True)
class CollectiveCurve(ParamSet):
    latency_us: float = param(5.0, 0.0, 2000.0, "small-message latency, us")
    bandwidth_gbps: float = param(100.0, 0.01, 10000.0, "bus bandwidth: bytes x 2(n-1)/n per second, GB/s")
    ramp_us: float = param(2.0, 0.0, 5000.0, "latency added as messages outgrow the small-message protocol, us")
    ramp_bytes: float = param(1e5, 100.0, 1e10, "message size where the ramp is half done, bytes")


def allreduce_time(curve: CollectiveCurve, nbytes, gpus) -> Times:
    b, n = arrays(nbytes, gpus)
    bandwidth = b * 2.0 * (n - 1.0) / n / (curve.bandwidth_gbps * 1e9)
    fixed = (curve.latency_us + curve.ramp_us * b / (b + curve.ramp_bytes)) * 1e-6
    seconds = np.where(n > 1, fixed + bandwidth, 0.0)
    return Times(seconds, np.zeros_like(seconds), np.where(n > 1, bandwidth, 0.0), np.where(n > 1, fixed, 0.0))


def nearest_curve(curves: dict[int, CollectiveCurve], gpus: int) -> tuple[CollectiveCurve, int]:
    """The fitted curve for this GPU count, else the nearest fitted count (its bus bandwidth scales by 2(n-1)/n)."""
    if gpus in curves:
        return curves[gpus], gpus
    nearest = min(curves, key=lambda n: (abs(n - gpus), -n))
    return curves[nearest], nearest
