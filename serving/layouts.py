"""Parallel layouts of a deployment: how N GPUs are split into replicas, stages and shards.

A layout is TP x PP GPUs per replica, DP replicas, and for MoE models an expert-parallel size. With attention
data parallelism (SGLang's and TensorRT-LLM's way of serving DeepSeek) the DP ranks keep their own attention
and batch, and their MoE layers form one expert-parallel group of EP = TP x DP GPUs.
"""
from __future__ import annotations

from dataclasses import dataclass

from cost.estimate import Parallelism
from cost.execution import EP_ALL_TOKENS, EP_DISPATCH
from cost.profile import HardwareProfile


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    dp: int = 1                  # replicas, or attention-DP ranks
    ep: int = 1                  # 1: experts sharded like the dense layers (by TP)
    attention_dp: bool = False
    ep_style: str = EP_ALL_TOKENS

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp

    @property
    def parallelism(self) -> Parallelism:
        return Parallelism(self.tp, self.ep, self.ep_style, self.pp, self.dp if self.attention_dp else 1)

    def nodes(self, hw: HardwareProfile) -> int:
        return -(-self.gpus // hw.gpus_per_node)

    @property
    def label(self) -> str:
        parts = [f"TP{self.tp}"]
        if self.pp > 1:
            parts.append(f"PP{self.pp}")
        parts.append(f"{'ADP' if self.attention_dp else 'DP'}{self.dp}")
        if self.ep > 1:
            parts.append(f"EP{self.ep}" + ("d" if self.ep_style == EP_DISPATCH else ""))
        return " ".join(parts)

    def as_json(self) -> dict:
        return {"tp_size": self.tp, "pp_size": self.pp, "dp_size": self.dp, "ep_size": self.ep,
                "attention_dp": self.attention_dp, "ep_style": self.ep_style if self.ep > 1 else None}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class LayoutSpace:
    """What the search may try; None: every size the devices and the model allow."""
    tp_sizes: tuple[int, ...] | None = None
    pp_sizes: tuple[int, ...] | None = None
    ep_sizes: tuple[int, ...] | None = None
    attention_dp: str = "auto"   # auto (MoE models only), on (only attention-DP layouts), off
    ep_style: str = EP_ALL_TOKENS


def layouts(num_gpus: int, heads: int, experts: int, space: LayoutSpace = LayoutSpace()) -> list[Layout]:
    """Layouts that use all `num_gpus`: TP dividing the attention heads, PP up to 8 stages, and for MoE models
    EP of 1 or TP (a divisor of the experts); attention-DP layouts for MoE models, their EP = TP x DP (with
    redundant expert slots where it does not divide the experts)."""
    powers = [d for d in _divisors(num_gpus) if d & (d - 1) == 0]
    tps = [t for t in (space.tp_sizes or powers) if num_gpus % t == 0 and (heads % t == 0 or space.tp_sizes)]
    pps = [p for p in (space.pp_sizes or [1]) if num_gpus % p == 0]
    out: list[Layout] = []
    for tp in tps:
        for pp in pps:
            if num_gpus % (tp * pp):
                continue
            dp = num_gpus // (tp * pp)
            if space.attention_dp != "on":
                eps = [1]
                if experts:
                    eps = space.ep_sizes or sorted({1, tp})
                for ep in eps:
                    if ep == 1 or (experts % ep == 0 and tp % ep == 0):
                        out.append(Layout(tp, pp, dp, ep, False, space.ep_style if ep > 1 else EP_ALL_TOKENS))
            # an EP group that does not divide the experts holds redundant copies (cost/execution.expert_slots)
            if experts and dp > 1 and space.attention_dp != "off" and tp * dp <= experts and \
                    (not space.ep_sizes or tp * dp in space.ep_sizes):
                out.append(Layout(tp, pp, dp, tp * dp, True, space.ep_style))
    # (EP over more GPUs than one replica's TP is one MoE group over ranks that step in lockstep: attention DP)
    return list(dict.fromkeys(out))


__all__ = ["Layout", "LayoutSpace", "layouts"]
