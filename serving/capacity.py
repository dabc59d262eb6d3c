"""How many tokens of KV cache a serving replica holds: the engine's memory budget less weights, activations
and its reserve, as each engine divides memory (cost/engines.py, ServingDefaults).

- vLLM gives weights, the profile run's activations, its reserve and KV together a fraction of total memory
  (gpu_memory_utilization 0.9; CUDA graphs are captured after the KV cache is sized, beyond it);
- SGLang gives weights and the KV pool a fraction (mem_fraction_static ~0.88); activations and graphs use the rest;
- TensorRT-LLM gives the KV cache a fraction of what is free once the engine is loaded
  (kv_cache_free_gpu_mem_fraction 0.9 by default).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from cost.engines import ServingDefaults
from cost.execution import expert_slots, replicated
from cost.profile import HardwareProfile
from tracer.work import Trace

from .preemption import OnDemandKV

GB = 1e9

# How an engine decides what its KV cache can admit: the share of a running request's output KV it counts, on
# average, per admission policy (serving/steady_state.py admitted).
KV_ADMISSION = {
    # vLLM allocates blocks for the tokens it schedules each step and preempts when they run out
    # (vllm/v1/core/sched/scheduler.py, KVCacheManager.allocate_slots): a request holds its input and its output so
    # far, half of it over its life
    "allocate_as_generated": 0.5,
    # SGLang reserves max_new_tokens x new_token_ratio for running requests
    # (python/sglang/srt/managers/schedule_policy.py PrefillAdder; SGLANG_INIT_NEW_TOKEN_RATIO 0.7)
    "new_token_ratio": 0.7,
    # TensorRT-LLM's default capacity scheduler admits a request only with its whole output's blocks
    # (tensorrt_llm/llmapi/llm_args.py CapacitySchedulerPolicy.GUARANTEED_NO_EVICT)
    "guaranteed_no_evict": 1.0,
    # TensorRT-LLM's MAX_UTILIZATION packs as many requests as the free blocks hold now and pauses the newest when
    # they run out (batch_manager MaxUtilizationScheduler): a request holds what it has generated, as in vLLM
    "max_utilization": 0.5,
}
ENGINE_KV_ADMISSION = {"vllm": "allocate_as_generated", "sglang": "new_token_ratio", "trtllm": "guaranteed_no_evict"}
# the capacity-scheduler policies a launch can choose, per engine (the first is the engine's default)
CAPACITY_SCHEDULERS = {"trtllm": ("guaranteed_no_evict", "max_utilization")}


def kv_admission(engine: str, capacity_scheduler: str | None = None) -> str:
    """The admission policy `engine` runs: the capacity scheduler its launch chose, else its own default."""
    if capacity_scheduler is None:
        return ENGINE_KV_ADMISSION.get(engine, "guaranteed_no_evict")
    if capacity_scheduler not in CAPACITY_SCHEDULERS.get(engine, ()):
        choices = ", ".join(CAPACITY_SCHEDULERS.get(engine, ())) or "none: it has one admission policy"
        raise ValueError(f"capacity scheduler '{capacity_scheduler}' is not one of {engine}'s ({choices})")
    return capacity_scheduler


def output_kv_share(engine: str, capacity_scheduler: str | None = None) -> float:
    return KV_ADMISSION[kv_admission(engine, capacity_scheduler)]


# the policies that give a running request blocks as it generates and preempt when they run out
PREEMPTING = ("allocate_as_generated", "max_utilization")


def on_demand_kv(engine: str, capacity_scheduler: str | None, block_tokens: int,
                 spare_slots: int = 0) -> OnDemandKV | None:
    """The engine's on-demand KV allocation (serving/preemption.py) where its admission policy preempts, else None."""
    if kv_admission(engine, capacity_scheduler) not in PREEMPTING:
        return None
    return OnDemandKV(block_tokens, spare_slots)


def kv_admission_note(engine: str, policy: str) -> str | None:
    """The output's note on how the engine admits KV, where a launch can choose (None elsewhere)."""
    if engine not in CAPACITY_SCHEDULERS:
        return None
    how = ("a request is admitted with its whole output's blocks; --capacity-scheduler max_utilization admits what "
           "fits now" if policy == "guaranteed_no_evict" else
           "a request holds the blocks it has filled; the newest pause when they run out")
    return f"KV admission: TensorRT-LLM's {policy} capacity scheduler ({how})"


def reserves_whole_output(engine: str, capacity_scheduler: str | None = None) -> bool:
    """The policy admits a request only with its whole sequence's blocks (the simulator's reserve_output)."""
    return output_kv_share(engine, capacity_scheduler) >= 1.0


@dataclass(frozen=True)
class ReplicaMemory:
    """Bytes per GPU of one replica, and the KV tokens the replica holds."""
    weights: float
    activations: float
    reserve: float
    kv_cache: float
    kv_tokens: int
    kv_bytes_per_token: float    # per GPU
    state_tokens_per_sequence: int = 0   # recurrent (SSM / linear-attention) state of one request, in KV tokens
    attention_kv: bool = True            # False: no layer keeps a KV cache (pure SSM); memory counts states


def at_logged_capacity(mem: ReplicaMemory, tokens: int) -> ReplicaMemory:
    """The replica as its engine reported it: `tokens` of KV cache (vLLM logs "GPU KV cache size: N tokens" at
    start) in place of the capacity estimated from memory."""
    return replace(mem, kv_tokens=tokens, kv_cache=tokens * mem.kv_bytes_per_token)


def kv_heads(trace: Trace) -> int:
    return next((op.attention.kv_heads for op in trace.ops if op.attention is not None), 1)


def kv_bytes_per_token(trace: Trace, tp: int, pp: int = 1) -> float:
    """KV bytes one token holds on one GPU: KV heads shard over TP (a single latent head does not), layers
    over pipeline stages."""
    return trace.kv_bytes_per_token / max(1, min(tp, kv_heads(trace))) / max(1, pp)


def peak_activation_bytes(trace: Trace, tp: int) -> float:
    """The largest working set of one op (inputs + outputs besides weights): what must be live at once."""
    peak = 0.0
    for op in trace.ops:
        live = op.bytes - op.weight_bytes
        if op.attention is not None:  # the KV it reads is cache, counted apart
            w = op.attention
            live = w.batch * w.heads * w.query_length * (w.qk_head_dim + w.v_head_dim) * 2
        if op.tp_sharded:
            live /= tp
        peak = max(peak, live)
    return peak


def expert_weight_bytes(trace: Trace) -> float:
    """Bytes of every routed expert's weights (an experts op reads only its active experts' share)."""
    return sum(op.weight_bytes / max(op.experts.active_experts, 1e-9) * op.experts.num_experts * op.count
               for op in trace.ops if op.experts is not None)


def replicated_weight_bytes(trace: Trace) -> float:
    """Bytes of the weights every tensor-parallel rank holds whole (the router, MLA's low-rank down projections:
    cost/execution.py replicated)."""
    return sum(op.weight_bytes * op.count for op in trace.ops if op.tp_sharded and replicated(op))


def weight_bytes_per_gpu(trace: Trace, tp: int = 1, ep: int = 1, pp: int = 1, expert_resident: float = 1.0) -> float:
    """Dense weights shard over TP but for the replicated few, routed experts over EP (or TP without EP); PP splits
    the layers. `expert_resident`: what the experts occupy in the engine's layout over their stored bytes
    (cost/op_formats.py)."""
    stored, whole = expert_weight_bytes(trace), replicated_weight_bytes(trace)
    held = _slot_share(trace, ep)
    dense = (trace.weight_bytes - stored - whole) / tp + whole
    return (dense + stored * expert_resident * held / (ep if ep > 1 else tp)) / max(1, pp)


def _slot_share(trace: Trace, ep: int) -> float:
    """Expert copies per expert an EP group holds (1, or more with redundant slots: cost/execution.expert_slots)."""
    routed = next((op.experts.num_experts for op in trace.ops if op.experts is not None), 0)
    return expert_slots(routed, ep) / routed if routed and ep > 1 else 1.0


def replica_memory(probe: Trace, hw: HardwareProfile, defaults: ServingDefaults, reserve_gb: float, tp: int = 1,
                   pp: int = 1, ep: int = 1, memory_fraction: float | None = None,
                   group_reserve_gb: float = 0.0, expert_resident: float = 1.0) -> ReplicaMemory:
    """`probe`: a trace of the engine's largest step (max_batched_tokens tokens), for its activations.
    Under attention data parallelism `tp` is the attention TP of one DP rank, `ep` the whole MoE group.
    `group_reserve_gb`: what each GPU of a replica of more than one holds for its communicators."""
    fraction = defaults.memory_fraction if memory_fraction is None else memory_fraction
    capacity = hw.memory_bytes
    weights = weight_bytes_per_gpu(probe, tp, ep, pp, expert_resident)
    activations = peak_activation_bytes(probe, tp)
    reserve = (reserve_gb + (group_reserve_gb if max(tp * pp, ep) > 1 else 0.0)) * GB
    in_budget = activations if defaults.activations_in_budget else 0.0
    if defaults.memory_of_free:
        kv = fraction * (capacity - weights - activations - reserve)
    else:
        kv = fraction * capacity - weights - in_budget - reserve
    per_token = kv_bytes_per_token(probe, tp, pp)
    # hybrid and recurrent models hold a constant state per request besides (or instead of) the KV cache
    state = probe.state_bytes_per_sequence / max(1, tp) / max(1, pp)
    attention_kv = per_token > 0
    if not attention_kv:      # no KV cache at all: count the memory in units of one request's state
        per_token = state or 1.0
    return ReplicaMemory(weights, activations, reserve, max(0.0, kv), int(max(0.0, kv) // per_token), per_token,
                         math.ceil(state / per_token), attention_kv)
