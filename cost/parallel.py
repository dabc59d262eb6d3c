"""Communication of tensor and expert parallelism, priced with an alpha-beta model on the interconnect."""
from __future__ import annotations

from .profile import HardwareProfile


def all_reduce_seconds(nbytes: float, ranks: int, hw: HardwareProfile) -> float:
    """Ring all-reduce: 2(p-1)/p of the data crosses each link, in 2(p-1) latency-bound steps."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    bandwidth = hw.interconnect_bandwidth_gbps * 1e9 * hw.efficiency.communication
    return 2 * (ranks - 1) / ranks * nbytes / bandwidth + 2 * (ranks - 1) * hw.interconnect_latency_us * 1e-6


def all_to_all_seconds(nbytes_per_rank: float, ranks: int, hw: HardwareProfile) -> float:
    """Each rank sends (p-1)/p of its data to the others; one latency per peer exchange round."""
    if ranks <= 1 or nbytes_per_rank <= 0:
        return 0.0
    bandwidth = hw.interconnect_bandwidth_gbps * 1e9 * hw.efficiency.communication
    return (ranks - 1) / ranks * nbytes_per_rank / bandwidth + (ranks - 1) * hw.interconnect_latency_us * 1e-6
