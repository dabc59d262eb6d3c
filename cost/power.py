"""Power-limited parts: the clock a board-power-capped GPU sustains during dense matrix work.

A datasheet's matrix TFLOPS assume a clock (H100 NVL: 835.5 dense BF16 TFLOPS = 132 SMs x 4096 FLOP/clock x
1.545 GHz). A dense GEMM at that clock draws more than a 350-400 W card may use, so the card lowers its clock
until the board power fits the limit; memory-bound kernels draw less and keep their clock. The engine kernel
models such a part carries over from a 700 W sibling (H100 SXM) were measured where the power limit barely binds,
so their compute fractions hold the sibling's sustained clock, not this part's.

`PowerLimit.matrix_clock` is that ratio: the clock this part sustains under its board limit during dense matrix
work, as a fraction of its datasheet clock, relative to the same fraction on the device its kernel models were
fitted on. It can exceed 1 where the fitted part is the more power-bound one: a GeForce RTX 4090 carries the L40S's
kernel models (the same AD102 die), but its tensor cores run BF16/FP16 with FP32 accumulation at half the L40S's
rate per clock (the datasheets' 165.2 against 362.05 TFLOPS), so a dense GEMM draws far less of its 450 W and holds
its boost clock (it runs a 4096^3 GEMM at its datasheet rate), where the L40S's full-rate GEMMs pull its clock down
under 350 W (its tables, at ~0.6 of its datasheet rate).

It scales every matrix peak the cost model reads (`HardwareProfile.matrix_peak`): GEMMs, MoE experts, prefill
attention. Profile section:

    "power_limit": {"board_w": 400, "reference_board_w": 700, "matrix_clock": 0.8, "origin": "fitted by ..."}

A device whose engine kernels are fitted on its own tables has no such section: its tables ran at its own limit.

A cap set on a part below the board power it is priced at (`nvidia-smi -pl`; MLPerf's MaxQ systems state
`power_limit=500`) is `DEVICE@WATTSW` (`h200@500W`), priced by `capped_matrix_clock`.
"""
from __future__ import annotations

from dataclasses import dataclass

from .engine_kernels.params import ParamSet, param


@dataclass(frozen=True)
class PowerLimit(ParamSet):
    matrix_clock: float = param(1.0, 0.5, 2.0, "clock sustained during dense matrix work under the board power "
                                                "limit, as a fraction of the datasheet clock, relative to the "
                                                "device the kernel models were fitted on (1: the limit binds as "
                                                "there; 0.5: below every Hopper part's base clock, about 0.6-0.7 "
                                                "of its datasheet clock; above 1: the limit binds less than on "
                                                "the fitted part, whose own clock fell under its limit; 2: a "
                                                "part at its datasheet clock against one held to half of it)")


# The cap law: matrix work is power-bound at the clocks a cap leaves (a dense GEMM draws the full board power), so
# its clock falls in proportion to the power. H100 NVL's fit on its own MLPerf rows is the check: 0.576 +- 0.076
# at 400 W against H100 SXM's 700 W, where the law gives 400/700 = 0.571.
POWER_CAP_LAW = ("dense matrix clock in proportion to the board power (checked by H100 NVL's fit: 0.576 +- 0.076 "
                 "at 400/700 W, the law's 0.571)")
LOWEST_CAP_SHARE = 0.5      # below half the rated power the law is unchecked (and below every Hopper base clock)


def capped_matrix_clock(matrix_clock: float, board_w: float, watts: float, part: str) -> float:
    """The dense matrix clock (as `PowerLimit.matrix_clock`) of a part priced at `matrix_clock` and `board_w`
    watts once its board power is capped at `watts`."""
    if not board_w:
        raise ValueError(f"{part} states no board power (its profile's board_w), so a power cap cannot be priced")
    if not LOWEST_CAP_SHARE * board_w <= watts <= board_w:
        raise ValueError(f"a {watts:g} W cap on {part}: give {LOWEST_CAP_SHARE * board_w:g}-{board_w:g} W (its "
                         f"board power is {board_w:g} W; below half of it the cap law is unchecked)")
    return matrix_clock * watts / board_w


__all__ = ["LOWEST_CAP_SHARE", "POWER_CAP_LAW", "PowerLimit", "capped_matrix_clock"]
