"""Cost a trace on a device: kernels, their times, communication, and the step latency."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from tracer.work import ATTENTION, GEMM, OTHER, Trace

from .execution import ENGINE, Kernel, build_kernels
from .kernels import COMPUTE, MEMORY, OVERHEAD, KernelTime, attention_time, experts_time, gemm_time, stream_time
from .parallel import all_reduce_seconds, all_to_all_seconds
from .profile import HardwareProfile
from .recurrent import state_time

COMMUNICATION = "communication"
BREAKDOWN_CLASSES = (GEMM, ATTENTION, COMMUNICATION, OTHER)


@dataclass(frozen=True)
class Parallelism:
    tp: int = 1
    ep: int = 1


@dataclass(frozen=True)
class PricedKernel:
    kernel: Kernel
    time: KernelTime

    @property
    def total_seconds(self) -> float:
        return self.time.seconds * self.kernel.count


@dataclass
class Estimate:
    device: str
    execution: str
    parallelism: Parallelism
    latency_s: float
    breakdown_s: dict[str, float]
    bound_s: dict[str, float]
    flops: float
    bytes: float
    num_kernels: int
    host_s: float = 0.0        # CPU time to launch the step's kernels
    kernels: list[PricedKernel] = field(default_factory=list)

    @property
    def wall_s(self) -> float:
        """The step as a clock sees it: kernels run while the host launches, so the slower of the two."""
        return max(self.latency_s, self.host_s)

    def top(self, n: int = 10) -> list[tuple[str, str, float, int, str]]:
        """Heaviest kernels grouped by (name, module kind): (name, class, seconds, launches, dominant bound)."""
        groups: dict[tuple, list] = defaultdict(lambda: [0.0, 0, defaultdict(float)])
        for pk in self.kernels:
            op = pk.kernel.op
            where = op.module.split(".")[-1] if op is not None and op.module else ""
            g = groups[(pk.kernel.name, pk.kernel.op_class, where)]
            g[0] += pk.total_seconds
            g[1] += pk.kernel.count
            g[2][pk.time.bound] += pk.total_seconds
        rows = sorted(groups.items(), key=lambda kv: -kv[1][0])[:n]
        return [(f"{name} [{where}]" if where else name, cls, s, c, max(b, key=b.get))
                for (name, cls, where), (s, c, b) in rows]


def price_kernel(k: Kernel, hw: HardwareProfile) -> KernelTime:
    op = k.op
    if op is not None and op.experts is not None:
        return experts_time(k.flops, k.bytes, op.experts, op.dtype, hw)
    if op is not None and op.attention is not None:
        return attention_time(k.flops, k.bytes, op.attention, op.dtype, hw, masked=k.masked)
    if op is not None and op.state is not None:  # SSM / linear-attention cores and short convolutions
        return state_time(k.flops, k.bytes, op.state, op.dtype, hw)
    if k.op_class == GEMM:
        return gemm_time(k.flops, k.bytes, k.gemm, k.dtype, hw)
    return stream_time(k.flops, k.bytes, k.dtype, hw, broadcast=k.broadcast)


def communication_seconds(trace: Trace, par: Parallelism, hw: HardwareProfile, act_bytes: int = 2) -> float:
    """Two all-reduces per layer under TP; all-to-all dispatch and combine per MoE layer under EP."""
    tokens = trace.request.tokens
    hidden_bytes = tokens * trace.hidden_size * act_bytes
    total = 0.0
    moe_layers = sum(op.count for op in trace.ops if op.experts is not None)
    if par.tp > 1:
        # attention and MLP outputs are all-reduced; under EP a MoE layer's output is combined by all-to-all instead
        reduces = 2 * trace.num_layers - (moe_layers if par.ep > 1 else 0)
        total += reduces * all_reduce_seconds(hidden_bytes, par.tp, hw)
    if par.ep > 1:
        for op in trace.ops:
            if op.experts is not None:
                routed = op.experts.tokens * op.experts.top_k * op.experts.hidden_size * act_bytes / par.tp
                total += 2 * op.count * all_to_all_seconds(routed, par.ep, hw)
    return total


def estimate(trace: Trace, hw: HardwareProfile, execution: str = ENGINE, par: Parallelism = Parallelism()) -> Estimate:
    kernels = build_kernels(trace, execution, par.tp, par.ep)
    priced = [PricedKernel(k, price_kernel(k, hw)) for k in kernels]
    breakdown = {c: 0.0 for c in BREAKDOWN_CLASSES}
    bound = {COMPUTE: 0.0, MEMORY: 0.0, OVERHEAD: 0.0}
    for pk in priced:
        breakdown[pk.kernel.op_class] += pk.total_seconds
        bound[pk.time.bound] += pk.total_seconds
    comm = communication_seconds(trace, par, hw)
    breakdown[COMMUNICATION] = comm
    launches = sum(k.count for k in kernels)
    return Estimate(device=hw.name, execution=execution, parallelism=par, latency_s=sum(breakdown.values()),
                    breakdown_s=breakdown, bound_s=bound, flops=sum(k.flops * k.count for k in kernels),
                    bytes=sum(k.bytes * k.count for k in kernels), num_kernels=launches,
                    host_s=host_seconds(trace, execution, launches, hw), kernels=priced)


def host_seconds(trace: Trace, execution: str, launches: int, hw: HardwareProfile) -> float:
    """HF eager pays Python dispatch per op; an engine launches each kernel, and replays decode as a CUDA graph."""
    if execution != ENGINE:
        return launches * hw.efficiency.eager_host_us * 1e-6
    return 0.0 if trace.request.decode else launches * hw.kernel_launch_us * 1e-6
