"""An optimizer candidate as the launch layout of cli/inference/launch_commands.py: the sizes per replica and the
engine limits the search assumed, the KV-bound vLLM --max-model-len, and the winning speculative draft."""
from __future__ import annotations

from dataclasses import replace

from cost.engines import ENGINES
from cost.layout_checks import ModelFacts
from serving.search import DISAGG, MIXED, Candidate
from tracer.model_source import bundled_models

from ..common import speculations, warn
from .launch_commands import Disaggregation, Role, ServingLayout


def serving_layout(args, c: Candidate, experts: int, hw, spec, longest: int) -> ServingLayout:
    """The candidate as launch flags: sizes per replica, the engine's limits the search assumed."""
    lay = c.layout
    if lay.ep > 1 and lay.ep not in (lay.tp, lay.tp * lay.dp):
        warn(f"EP {lay.ep} with TP {lay.tp} has no launch flag in these engines; the command uses EP = TP")
    ep = lay.ep if lay.ep in (lay.tp, lay.tp * lay.dp) else (lay.tp if lay.ep > 1 else 0)
    fraction = args.gpu_memory_utilization or ENGINES[args.engine].serving_defaults(hw.memory_capacity_gb,
                                                                                    hw.name).memory_fraction
    disagg = None
    if c.mode == DISAGG:
        pre = c.prefill
        disagg = Disaggregation(Role(c.prefill_instances, pre.tp, pre.ep if pre.ep == pre.tp else 0),
                                Role(c.decode_instances, lay.tp, lay.ep if lay.ep == lay.tp else 0))
    bundled = bundled_models().get(args.model.lower())
    model_id = bundled.hf_id if bundled is not None else args.model
    draft = next((d for d in speculations(args) if d.label == c.speculation), None) if c.speculation else None
    if draft is not None and draft.method == "draft":     # the engine loads the draft by its Hugging Face id
        found = bundled_models().get((draft.draft_model or "").lower())
        draft = replace(draft, draft_model=found.hf_id if found is not None else draft.draft_model)
    return ServingLayout(model_id, lay.tp, lay.pp, lay.dp if c.mode == MIXED else 1, ep, c.max_num_seqs,
                         c.max_batched_tokens, args.prefix_cache_hit_rate > 0 or
                         bool(args.prefix_cache_hit_rate_distribution), fraction,
                         "fp8" if args.kv_cache_dtype == "fp8" else "auto", experts > 0, disagg,
                         trust_remote_code=args.trust_remote_code, revision=args.revision,
                         device_memory_gb=hw.memory_capacity_gb,
                         weights_gb_per_gpu=(c.memory.weights + c.memory.activations) / 1e9 if c.memory else None,
                         max_model_len=vllm_max_model_len(args.engine, c, spec.config, longest),
                         speculative=draft, capacity_scheduler=getattr(args, "capacity_scheduler", None))


def vllm_max_model_len(engine: str, c: Candidate, config: dict, longest: int) -> int | None:
    """A --max-model-len for vLLM where the candidate's KV cache holds fewer tokens than the model's own maximum
    (vLLM would refuse to start): the longest request asked for, rounded up to 1024 tokens, within the cache."""
    if engine != "vllm" or c.memory is None:
        return None
    # vLLM's default max_model_len is the config's context, rope scaling considered (its derived max length)
    model_max = ModelFacts.from_config(config).max_context
    kv = c.memory.kv_tokens
    if not model_max or kv >= model_max:
        return None
    return min(kv, -(-longest // 1024) * 1024)


__all__ = ["serving_layout", "vllm_max_model_len"]
