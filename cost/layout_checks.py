"""Is a serving layout consistent with the model? Errors refuse it; warnings state what is assumed.

API (the CLIs call it once they know the model and the layout):

    from cost.layout_checks import Layout, ModelFacts, check_layout
    facts = ModelFacts.from_config(spec.config)             # heads, KV heads, routed experts, max length
    report = check_layout(facts, Layout(tp=4, ep=1, pp=1, devices=8), input_length=4096, moe_imbalance=1.0)
    report.errors     # tuple[str, ...]: refuse (exit 2) when not empty; report.raise_errors() raises LayoutError
    report.warnings   # tuple[str, ...]: print each, and put them in --json output ("warnings")

Rules (as vLLM applies them):
- TP must divide the attention heads.
- KV heads: TP <= kv_heads needs TP | kv_heads (each rank holds kv_heads / TP); TP > kv_heads needs
  kv_heads | TP, and each KV head is then replicated on TP / kv_heads ranks (a warning says so: the KV cache
  per device is one head's, not 1/TP of the whole). MLA's latent KV is one shared head: no rule.
- EP needs routed experts and must divide them. --moe-imbalance on a dense model, and --ep-style without EP,
  have no effect (a warning).
- The layout's devices, max(TP, EP) x PP, must fit the devices available (when known).
- An input longer than the model's maximum context (max_position_embeddings, extended by rope scaling
  where the config's rope type extends it) is a warning: the model was not trained for it.
"""
from __future__ import annotations

from dataclasses import dataclass

from tracer.config_checks import max_context, model_dims  # noqa: F401 - max_context: part of this API
from .execution import EP_ALL_TOKENS, expert_slots


class LayoutError(ValueError):
    """An inconsistent layout; the message lists every rule it breaks."""


@dataclass(frozen=True)
class ModelFacts:
    name: str
    heads: int
    kv_heads: int
    routed_experts: int | None = None    # None: a dense model
    latent_kv: bool = False              # MLA
    max_context: int | None = None       # longest input the model supports, rope scaling considered

    @classmethod
    def from_config(cls, config: dict, name: str = "the model") -> "ModelFacts":
        d = model_dims(config, name)
        heads = d.heads or 1
        return cls(name=name, heads=heads, kv_heads=d.kv_heads or heads, routed_experts=d.routed_experts,
                   latent_kv=d.latent_kv, max_context=d.max_context)


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    ep: int = 1
    pp: int = 1
    devices: int | None = None     # devices available; None: not stated

    @property
    def devices_needed(self) -> int:
        return max(self.tp, self.ep) * self.pp


@dataclass(frozen=True)
class LayoutReport:
    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.errors

    def raise_errors(self) -> None:
        if self.errors:
            raise LayoutError("; ".join(self.errors))


def check_layout(facts: ModelFacts, layout: Layout, input_length: int | None = None,
                 moe_imbalance: float | None = None, ep_style: str | None = None) -> LayoutReport:
    errors, warnings = [], []
    tp, ep = layout.tp, layout.ep
    if min(tp, ep, layout.pp) < 1:
        errors.append(f"TP, EP and PP must be >= 1 (got TP={tp}, EP={ep}, PP={layout.pp})")
        return LayoutReport(tuple(errors), ())
    if facts.heads % tp:
        errors.append(f"TP={tp} does not divide {facts.name}'s {facts.heads} attention heads "
                      f"(divisors up to 64: {', '.join(map(str, _divisors(facts.heads)))})")
    elif not facts.latent_kv:
        kv = facts.kv_heads
        if tp <= kv and kv % tp:
            errors.append(f"TP={tp} does not divide {facts.name}'s {kv} KV heads")
        elif tp > kv and tp % kv:
            errors.append(f"TP={tp} is neither a divisor nor a multiple of {facts.name}'s {kv} KV heads")
        elif tp > kv:
            warnings.append(f"TP={tp} exceeds {facts.name}'s {kv} KV heads: each KV head is replicated on "
                            f"{tp // kv} ranks (as vLLM does), so every device holds one KV head's cache")
    if ep > 1:
        if not facts.routed_experts:
            errors.append(f"EP={ep} needs routed experts, and {facts.name} is a dense model (use --ep-size 1)")
        elif ep > facts.routed_experts:
            errors.append(f"EP={ep} exceeds {facts.name}'s {facts.routed_experts} routed experts")
        elif facts.routed_experts % ep:
            slots = expert_slots(facts.routed_experts, ep)
            warnings.append(f"EP={ep} does not divide {facts.name}'s {facts.routed_experts} routed experts: priced "
                            f"with {slots} expert slots ({slots - facts.routed_experts} redundant copies, "
                            f"{slots // ep} per rank) as expert load balancing places them (TensorRT-LLM num_slots, "
                            f"vLLM --num-redundant-experts)")
    if moe_imbalance is not None and moe_imbalance != 1.0 and not facts.routed_experts:
        warnings.append(f"--moe-imbalance {moe_imbalance:g} has no effect: {facts.name} has no routed experts")
    if ep_style is not None and ep_style != EP_ALL_TOKENS and ep == 1:
        warnings.append(f"--ep-style {ep_style} has no effect without expert parallelism (--ep-size 1)")
    if layout.devices is not None and layout.devices_needed > layout.devices:
        errors.append(f"the layout needs max(TP={tp}, EP={ep}) x PP={layout.pp} = {layout.devices_needed} devices, "
                      f"{layout.devices} available")
    if input_length is not None and facts.max_context and input_length > facts.max_context:
        warnings.append(f"{input_length:,} tokens exceed {facts.name}'s maximum context of {facts.max_context:,} "
                        f"(max_position_embeddings, rope scaling considered): the model was not trained for it; "
                        f"priced as if it ran")
    return LayoutReport(tuple(errors), tuple(warnings))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, min(n, 64) + 1) if n % d == 0]
