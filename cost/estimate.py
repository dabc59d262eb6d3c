"""Cost a trace on a device: kernels, their times, communication, and the step latency."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from tracer.work import ATTENTION, GEMM, OTHER, Trace

from .engines import DEFAULT_ENGINE, ENGINES, MLA_DECODE_QUERY_ROWS
from .execution import EAGER, ENGINE, EP_ALL_TOKENS, EP_DISPATCH, Kernel, build_kernels, expert_slots
from .kernels import COMPUTE, MEMORY, OVERHEAD, KernelTime, attention_time, experts_time, gemm_time, stream_time
from .engine_kernels import allreduce_time, nearest_curve
from .engine_kernels import stream_time as stream_engine
from .engine_kernels.tuned_moe import config_note
from .engine_pricing import decode_rows_in_prefill, price_engine_kernel
from .op_formats import RunFormat, formats_note, op_format
from .parallel import (all_reduce_seconds, cross_node_all_reduce_seconds,
                       group_all_to_all_seconds)
from .profile import HardwareProfile
from .provenance import Origin, kernel_origin
from .recurrent import state_time

COMMUNICATION = "communication"
BREAKDOWN_CLASSES = (GEMM, ATTENTION, COMMUNICATION, OTHER)


@dataclass(frozen=True)
class Parallelism:
    tp: int = 1
    ep: int = 1
    ep_style: str = EP_ALL_TOKENS   # how expert parallelism moves tokens (cost/execution.py)
    pp: int = 1                     # pipeline stages (serving/step_cost.py splits a step's layers over them)
    attention_dp: int = 1           # attention data-parallel ranks that share one expert-parallel MoE

    def __post_init__(self):
        for name in ("tp", "ep", "pp", "attention_dp"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.attention_dp > 1 and self.ep != self.tp * self.attention_dp:
            raise ValueError(f"attention-DP {self.attention_dp} x TP {self.tp} must equal EP {self.ep}: the "
                             f"DP ranks' MoE layers form one expert-parallel group")


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
    engine: str | None = None  # the serving engine whose kernel models priced it (engine execution)
    notes: list[str] = field(default_factory=list)
    origin: Origin | None = None  # where the kernel numbers come from (fitted here, or carried over from whom)
    layout_notes: list[str] = field(default_factory=list)   # the part of `notes` on collectives and expert slots

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
    """HF eager kernels, with the eager fit (`efficiency` section of the profile)."""
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


def _eager_communication(trace: Trace, par: Parallelism, hw: HardwareProfile, act_bytes: int = 2) -> float:
    """Two all-reduces per layer under TP; all-to-all dispatch and combine per MoE layer under EP."""
    tokens = trace.request.tokens
    hidden_bytes = tokens * trace.hidden_size * act_bytes
    total = 0.0
    moe_layers = sum(op.count for op in trace.ops if op.experts is not None)
    if par.tp > 1:
        # attention and MLP outputs are all-reduced; under EP a MoE layer's output is combined by all-to-all instead
        reduces = 2 * trace.num_layers - (moe_layers if par.ep > 1 else 0)
        total += reduces * (all_reduce_seconds(hidden_bytes, min(par.tp, hw.scale_up_gpus), hw)
                            + cross_node_all_reduce_seconds(hidden_bytes, par.tp, hw))
    if par.ep > 1:
        for op in trace.ops:
            if op.experts is not None:
                routed = op.experts.tokens * op.experts.top_k * op.experts.hidden_size * act_bytes / par.tp
                total += 2 * op.count * group_all_to_all_seconds(routed, par.ep, hw)
    return total


def engine_allreduce_seconds(nbytes: float, gpus: int, hw: HardwareProfile, engine: str,
                             notes: list[str] | None = None) -> float:
    """An all-reduce as the engine runs it: its custom all-reduce when the message and machine allow, else NCCL;
    priced by the fitted curves when the device has them, else by the ring model on the interconnect."""
    if gpus <= 1 or nbytes <= 0:
        return 0.0
    if gpus > hw.scale_up_gpus:     # hierarchical: inside each NVLink domain as usual, then between domains
        if notes is not None:
            notes.append(f"all-reduce over {gpus} GPUs crosses {hw.scale_up_gpus}-GPU interconnect domains: priced "
                         f"hierarchically on the scale-out network ({hw.scale_out_name or 'none'})")
        return engine_allreduce_seconds(nbytes, hw.scale_up_gpus, hw, engine, notes) + \
            cross_node_all_reduce_seconds(nbytes, gpus, hw)
    spec = ENGINES[engine]
    custom = (nbytes <= spec.custom_allreduce_max_bytes and gpus in spec.custom_allreduce_gpus
              and (not hw.pcie_only or gpus <= spec.pcie_custom_allreduce_max_gpus))
    if notes is not None and not hw.peer_to_peer:
        note = (f"all-reduce on {hw.interconnect_name}: no custom all-reduce without peer-to-peer, NCCL carries "
                f"every message, priced on its peer-to-peer PCIe curve; staged through host memory it may be slower")
        if note not in notes:
            notes.append(note)
    curves = hw.engine(engine).allreduce
    # the servers that would price this all-reduce otherwise: their own curves at this GPU count, or fewer GPUs
    # in one domain
    others = [] if notes is None or hw.topology or gpus <= 2 else \
        [name for name, t in hw.topologies.items() if any(str(gpus) in by_gpus for by_gpus in t.allreduce.values())
         or (t.interconnect.domain_gpus or gpus) < gpus]
    if others:
        notes.append(f"all-reduce over {gpus} GPUs priced on the topology the kernel tables were measured on "
                     f"({hw.interconnect_name}); other servers: "
                     + ", ".join(f"--device {hw.key}:{t}" for t in others))
    for impl in (("custom", "nccl") if custom else ("nccl",)):
        if impl in curves:
            curve, fitted_gpus = nearest_curve(curves[impl], gpus)
            if notes is not None and fitted_gpus != gpus:
                notes.append(f"all-reduce over {gpus} GPUs priced from the {fitted_gpus}-GPU {impl} curve")
            return float(allreduce_time(curve, nbytes, gpus).seconds)
    if notes is not None:
        notes.append("all-reduce priced by the ring model on the interconnect (no fitted curve for this device)")
    return all_reduce_seconds(nbytes, gpus, hw)


def _engine_communication(trace: Trace, par: Parallelism, hw: HardwareProfile, engine: str, notes: list[str],
                          act_bytes: int = 2) -> float:
    """Attention and MLP outputs are all-reduced over TP. Under all-tokens EP a MoE layer's partial outputs are
    all-reduced the same way; dispatch-style EP moves each rank's pairs by all-to-all instead."""
    hidden_bytes = trace.request.tokens * trace.hidden_size * act_bytes
    moe_layers = sum(op.count for op in trace.ops if op.experts is not None)
    dp = par.attention_dp
    total = 0.0
    group = max(par.tp, par.ep, par.tp * dp)
    if hw.gpus_per_node < group <= hw.scale_up_gpus:
        notes.append(f"collectives over {group} GPUs stay in the {hw.scale_up_gpus}-GPU scale-up domain: priced on "
                     f"{hw.interconnect_name} ({hw.interconnect_bandwidth_gbps:g} GB/s per direction), not the "
                     f"scale-out network")

    if dp > 1:
        # each DP rank's attention is its own (all-reduced over the attention TP only); its MoE layers take
        # every rank's tokens: gathered to all ranks (all-tokens) or sent to their experts (dispatch)
        total += 2 * trace.num_layers * engine_allreduce_seconds(hidden_bytes, par.tp, hw, engine, notes)
        for op in trace.ops:
            if op.experts is not None:
                w = op.experts
                if par.ep_style == EP_DISPATCH:
                    total += 2 * op.count * group_all_to_all_seconds(w.tokens * w.top_k * w.hidden_size * act_bytes,
                                                                     par.ep, hw)
                else:   # all-gather the DP ranks' tokens, reduce-scatter the outputs: one all-reduce's traffic
                    total += op.count * engine_allreduce_seconds(hidden_bytes * dp, par.ep, hw, engine, notes)
        notes.append(f"attention data parallel x{dp}: MoE layers over EP {par.ep} take every DP rank's tokens "
                     f"({par.ep_style} style)")
        return total
    group = max(par.tp, par.ep)
    reduces = 2 * trace.num_layers
    if par.ep > 1 and par.ep_style == EP_DISPATCH:
        reduces -= moe_layers
        for op in trace.ops:
            if op.experts is not None:
                routed = op.experts.tokens * op.experts.top_k * op.experts.hidden_size * act_bytes / par.ep
                total += 2 * op.count * group_all_to_all_seconds(routed, par.ep, hw)
        notes.append("dispatch-style EP: tokens reach only their experts' ranks by all-to-all (ring model)")
    if group > 1:
        total += reduces * engine_allreduce_seconds(hidden_bytes, group, hw, engine, notes)
    return total


def _moe_config_notes(kernels, formats, engine: str, hw: HardwareProfile, cal) -> list[str]:
    """Whether the engine runs each fused-MoE shape on a tuned configuration, where its kernel model tells the two
    apart (MoeParams.large_tile_tokens)."""
    notes = []
    for k, f in zip(kernels, formats):
        if k.moe is None or f is None or f.model not in cal.moe or cal.moe[f.model].large_tile_tokens < 0.5:
            continue
        note = config_note(engine, hw.key, f.model, k.moe.experts // k.moe.ep, k.moe.inter // k.moe.tp)
        if note and note not in notes:
            notes.append(note)
    return notes


def communication_seconds(trace: Trace, par: Parallelism, hw: HardwareProfile, act_bytes: int = 2) -> float:
    return _eager_communication(trace, par, hw, act_bytes)


def estimate(trace: Trace, hw: HardwareProfile, execution: str = ENGINE, par: Parallelism = Parallelism(),
             engine: str = DEFAULT_ENGINE, mixed_step: bool = False) -> Estimate:
    """The trace priced on `hw`. `mixed_step`: the trace's decode rows share their step with a prompt chunk the
    serving engine batches with them (serving/step_cost.py), which decides the kernel some engines run them on
    (cost/engine_pricing.py decode_rows_in_prefill)."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine '{engine}' (choose from {', '.join(ENGINES)})")
    kernels = build_kernels(trace, execution, par.tp, par.ep, ep_style=par.ep_style, attention_dp=par.attention_dp)
    notes: list[str] = []
    layout_notes: list[str] = []    # how the layout's collectives and expert slots were priced
    if execution == EAGER:
        priced = [PricedKernel(k, price_kernel(k, hw)) for k in kernels]
        comm = _eager_communication(trace, par, hw)
    else:
        cal = hw.engine(engine)
        dispatch = par.ep > 1 and par.ep_style == EP_DISPATCH
        tp_allreduce = par.tp > 1 and par.attention_dp == 1
        formats = [op_format(k.op, engine, hw, trace.options.dtype, tuple(cal.moe), tuple(cal.gemm),
                             trace.architecture, dispatch, k.moe.tokens if k.moe else None, tp_allreduce)
                   if k.op_class == GEMM else None for k in kernels]
        priced = [PricedKernel(k, _cached_engine_price(k, hw, cal, f, trace.kv_element_size, mixed_step))
                  for k, f in zip(kernels, formats)]
        notes += formats_note(kernels, formats, engine, hw)
        experts = next((op.experts.num_experts for op in trace.ops if op.experts is not None), 0)
        notes += _moe_config_notes(kernels, formats, engine, hw, cal)
        if experts and trace.options.moe_imbalance != 1.0:
            notes.append(f"MoE imbalance {trace.options.moe_imbalance:g}: every expert of a rank is priced at that "
                         f"many times its share of the tokens (the busiest one sets the pace)")
        if experts and expert_slots(experts, par.ep) != experts:
            slots = expert_slots(experts, par.ep)
            layout_notes.append(f"EP {par.ep} over {experts} routed experts: {slots} expert slots ({slots // par.ep} "
                                f"per rank, {slots - experts} redundant copies placed by expert load balancing)")
        comm = _engine_communication(trace, par, hw, engine, layout_notes)
        notes += layout_notes
        notes.append(f"{ENGINES[engine].label} kernels: {cal.origin}")
        notes += _attention_kernel_notes(kernels, engine, cal)
        used = {("moe" if k.op is not None and k.op.experts is not None else "gemm", f.model)
                for k, f in zip(kernels, formats) if f is not None}
        notes += [f"{ENGINES[engine].label} kernels: {key} from {where}" for key, where in cal.inherited.items()
                  if _inherited_used(key, used)]
        if any(k.op is not None and k.op.state is not None for k in kernels):
            notes.append("recurrent mixer kernels (SSM scans, linear attention, short convolutions): roofline "
                         "estimate (cost/recurrent.py), no fitted engine kernel model")
    breakdown = {c: 0.0 for c in BREAKDOWN_CLASSES}
    bound = {COMPUTE: 0.0, MEMORY: 0.0, OVERHEAD: 0.0}
    for pk in priced:
        breakdown[pk.kernel.op_class] += pk.total_seconds
        bound[pk.time.bound] += pk.total_seconds
    breakdown[COMMUNICATION] = comm
    launches = sum(k.count for k in kernels)
    origin = kernel_origin(hw, engine if execution == ENGINE else None)
    if origin.power:
        notes.append(origin.power)
    if origin.headline():
        notes.insert(0, origin.headline())
    return Estimate(device=hw.name, execution=execution, parallelism=par, latency_s=sum(breakdown.values()),
                    breakdown_s=breakdown, bound_s=bound, flops=sum(k.flops * k.count for k in kernels),
                    bytes=sum(k.bytes * k.count for k in kernels), num_kernels=launches,
                    host_s=host_seconds(trace, execution, launches, hw), kernels=priced,
                    engine=engine if execution == ENGINE else None, notes=list(dict.fromkeys(notes)), origin=origin,
                    layout_notes=list(dict.fromkeys(layout_notes)))


def _attention_kernel_notes(kernels: list[Kernel], engine: str, cal) -> list[str]:
    """The attentions an engine runs on another kernel than its fitted one, or in another form than the trace's."""
    label = ENGINES[engine].label
    attentions = [k.op.attention for k in kernels if k.op is not None and k.op.attention is not None]
    notes = []
    if cal.sink_backend and any(w.has_sinks for w in attentions):
        fitted = any(k.endswith(f"_{cal.sink_backend}") for k in cal.prefill_attention)
        notes.append(f"{label} kernels: attention with sink logits on its Triton backend here, "
                     + ("priced with that backend's own kernel models, fitted on its rows of the tables"
                        if fitted else "which has no kernel model of its own here: priced with the default backend's")
                     + f" ({cal.sink_attention['why']})")
    elif cal.sink_attention and any(w.has_sinks for w in attentions):
        notes.append(f"{label} kernels: attention with sink logits on its Triton unified attention kernel here: "
                     f"prefill priced as that kernel's key and value re-reads, one per 16 query rows, where they take "
                     f"longer than the fitted prefill kernel (cost/engine_kernels/unified_attention.py); decode on the "
                     f"fitted decode model ({cal.sink_attention['why']})")
    chunked = [w for w in attentions if w.chunk_binds]
    if chunked and ENGINES[engine].runs_attention_chunks:
        notes.append(f"{label} kernels: chunked local attention (a chunk of {chunked[0].chunk} tokens) priced by "
                     f"chunks, as {label} runs it: each piece of a sequence in one chunk a virtual sequence over its "
                     f"chunk's keys")
    elif chunked:
        w = chunked[0]
        notes.append(f"{label} kernels: chunked local attention (a chunk of {w.chunk} tokens) priced as full causal "
                     f"attention over all {w.context_length + w.query_length} keys: SGLang runs it so off Hopper; "
                     f"where an engine runs it by chunks (SGLang's FA3) this attention comes out slow "
                     f"(docs/hardware.md, \"An engine's chunked attention\")")
    rule = ENGINES[engine].mla_prefill
    mla = [w.expanded_head_dims for w in attentions if w.expanded_head_dims]
    if rule and mla:
        low, high = rule.absorbed_prefix
        kept = f", or over a cached prefix of {low}-{high} tokens," if low <= high else ""
        notes.append(f"{label} kernels: MLA prefill in the expanded multi-head form, K and V per head at head dims "
                     f"{mla[0][0]} / {mla[0][1]} up-projected from the latent cache (the cached context's "
                     f"up-projection priced as a bf16 GEMM); decodes and chunks of at most {MLA_DECODE_QUERY_ROWS} "
                     f"query rows{kept} run absorbed ({rule.source})")
    return notes


def sampling_seconds(rows: float, vocab: int, hw: HardwareProfile, engine: str = DEFAULT_ENGINE) -> float:
    """Sampling `rows` next tokens: the fp32 logits are read for the softmax and again for top-k/top-p."""
    if rows <= 0:
        return 0.0
    cal = hw.engine(engine)
    t = stream_engine(cal.elementwise, hw.bandwidth, hw.l2_bytes, 2 * rows * vocab * 4.0, rows * 8.0)
    return float(t.seconds)


_PRICE_CACHE: dict = {}


def _cached_engine_price(k: Kernel, hw: HardwareProfile, cal, fmt: RunFormat | None, kv_bytes: float,
                         mixed_step: bool = False) -> KernelTime:
    """Engine kernels of equal shape cost the same; layouts and steps repeat shapes, so price each once."""
    op = k.op
    if op is not None and op.state is not None:  # no engine kernel model for recurrent mixers: the roofline
        return state_time(k.flops, k.bytes, op.state, op.dtype, hw)
    attention = op.attention if op is not None else None
    mixed_step = mixed_step and attention is not None and decode_rows_in_prefill(attention, cal)
    shape = (k.gemm, k.moe, attention, k.op_class, k.bytes if k.gemm is None else 0, mixed_step)
    key = (hw.path or hw.key, id(cal), fmt, kv_bytes, shape)
    if key not in _PRICE_CACHE:
        if len(_PRICE_CACHE) > 200_000:
            _PRICE_CACHE.clear()
        _PRICE_CACHE[key] = price_engine_kernel(k, hw, cal, fmt, kv_bytes, mixed_step)
    return _PRICE_CACHE[key]


def host_seconds(trace: Trace, execution: str, launches: int, hw: HardwareProfile) -> float:
    """HF eager pays Python dispatch per op. An engine replays its steps as CUDA graphs (the fitted kernel times
    are graph replays); the serving model adds eager launches for batches beyond the captured sizes."""
    if execution != ENGINE:
        return launches * hw.efficiency.eager_host_us * 1e-6
    return 0.0


def _inherited_used(key: str, used: set) -> bool:
    """Whether a step uses an inherited model (`moe.fp8`): a GEMM or MoE format only where the step runs that
    format; other sections (attention, collectives, streams) always."""
    section, _, fmt = key.partition(".")
    return section not in ("gemm", "moe") or not fmt or (section, fmt) in used

