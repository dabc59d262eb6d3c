"""Streaming kernels of an engine: activation quantization and the fused elementwise kernels
(residual add + norm, rotary, activation). Both read and write each element once.

    time = fixed + max(HBM bytes / (bandwidth x efficiency) + L2 bytes / (that x L2 speedup), rows x row latency)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .common import Times, arrays
from .params import ParamSet, param


@dataclass(frozen=True)
class StreamParams(ParamSet):
    fixed_us: float = param(2.0, 0.0, 20.0, "per call: launch in a CUDA graph and tail, us")
    memory: float = param(0.85, 0.2, 1.0, "fraction of HBM bandwidth")
    row_ns: float = param(0.5, 0.0, 20.0, "per-row (token) latency of a row-reduction kernel, ns")
    l2_speedup: float = param(2.0, 1.0, 8.0, "bandwidth of an L2-resident input over HBM")


def stream_time(p: StreamParams, bandwidth: float, l2_bytes: float, read_bytes, write_bytes, rows=0.0,
                hot_input: bool = True) -> Times:
    """A kernel reading `read_bytes` (resident in L2 when `hot_input` and it fits) and writing `write_bytes`."""
    read_bytes, write_bytes, rows = arrays(read_bytes, write_bytes, rows)
    hot = hot_input & (read_bytes <= l2_bytes)
    memory = (np.where(hot, read_bytes / p.l2_speedup, read_bytes) + write_bytes) / (bandwidth * p.memory)
    latency = rows * p.row_ns * 1e-9
    fixed = p.fixed_us * 1e-6
    return Times(fixed + np.maximum(memory, latency), np.zeros_like(memory), np.maximum(memory, latency),
                 np.full_like(memory, fixed))


def quant_time(p: StreamParams, bandwidth: float, l2_bytes: float, m, k, act_bytes: float = 2.0,
               quant_bytes: float = 1.0) -> Times:
    """Dynamic per-token quantization of x[m,k]: read it, find each row's scale, write the narrow copy."""
    m, k = arrays(m, k)
    return stream_time(p, bandwidth, l2_bytes, m * k * act_bytes, m * k * quant_bytes + m * 4.0, rows=m)
