"""Time of a recurrent mixer's core (SSM scan, linear attention, short convolution): a small roofline.

The chunked kernels (Mamba-2 SSD, gated delta rules, lightning attention) do their intra-chunk products on the
matrix units; scans, recurrent decode steps and convolutions run on the vector units. The op's bytes (inputs,
outputs, the state read and written) stream at the elementwise efficiency; the fixed latency is the attention
kernel's. No separate calibration yet: these kernels have not been measured on a device.
"""
from __future__ import annotations

from tracer.work import StateWork

from .kernels import KernelTime
from .profile import HardwareProfile


def state_time(flops: float, nbytes: float, w: StateWork, dtype: str, hw: HardwareProfile) -> KernelTime:
    """`flops` and `nbytes` are the kernel's (after any sharding); the StateWork gives the matrix/vector split."""
    total = w.matrix_flops + w.vector_flops
    matrix_share = w.matrix_flops / total if total else 0.0
    eff = hw.efficiency
    matrix_dtype = dtype if dtype in hw.matrix_tflops else "bf16"
    compute = 0.0
    if matrix_share:
        compute += flops * matrix_share / (hw.matrix_peak(matrix_dtype) * eff.attention.compute)
    compute += flops * (1.0 - matrix_share) / hw.vector_peak("fp32")
    memory = nbytes / (hw.bandwidth * eff.elementwise.memory)
    fixed = eff.attention.fixed_us * 1e-6
    return KernelTime(max(compute, memory) + fixed, compute, memory, fixed)
