"""Power-limited parts: the clock a board-power-capped GPU sustains during dense matrix work.

A datasheet's matrix TFLOPS assume a clock (H100 NVL: 835.5 dense BF16 TFLOPS = 132 SMs x 4096 FLOP/clock x
1.545 GHz). A dense GEMM at that clock draws more than a 350-400 W card may use, so the card lowers its clock
until the board power fits the limit; memory-bound kernels draw less and keep their clock. The engine kernel
models such a part carries over from a 700 W sibling (H100 SXM) were measured where the power limit barely binds,
so their compute fractions hold the sibling's sustained clock, not this part's.

`PowerLimit.matrix_clock` is that ratio: the clock this part sustains under its board limit during dense matrix
work, as a fraction of its datasheet clock, relative to the same fraction on the device its kernel models were
fitted on. It scales every matrix peak the cost model reads (`HardwareProfile.matrix_peak`): GEMMs, MoE experts,
prefill attention. Profile section:

    "power_limit": {"board_w": 400, "reference_board_w": 700, "matrix_clock": 0.8, "origin": "fitted by ..."}

A device whose engine kernels are fitted on its own tables has no such section: its tables ran at its own limit.
"""
from __future__ import annotations

from dataclasses import dataclass

from .engine_kernels.params import ParamSet, param


@dataclass(frozen=True)
class PowerLimit(ParamSet):
    matrix_clock: float = param(1.0, 0.5, 1.0, "clock sustained during dense matrix work under the board power "
                                                "limit, as a fraction of the datasheet clock, relative to the "
                                                "device the kernel models were fitted on (1: the limit does not "
                                                "bind harder than there; 0.5: below every Hopper part's base "
                                                "clock, about 0.6-0.7 of its datasheet clock)")


__all__ = ["PowerLimit"]
