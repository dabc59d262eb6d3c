"""What the steady-state model (serving/steady_state.py) is asked and answers: the load offered to one replica,
the engine's limits on it, and the state it settles in (or that of the finite run it walks, serving/step_walk.py)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .preemption import OnDemandKV

RATE, CONCURRENCY, MAX = "rate", "concurrency", "max"
QUANTILES = (50, 90, 99)     # the percentiles of TTFT and TPOT a steady state reports


@dataclass(frozen=True)
class Load:
    kind: str                    # rate | concurrency | max
    value: float = 0.0           # requests/s, or users
    arrival: str = "poisson"     # open loop: poisson or constant
    requests: int = 0            # requests the run sends: queued at once (max), by the users (concurrency); 0: endless
    spread: int = 1              # this engine takes every spread-th request of the stream (round-robin routing)
    send_rate: float = 0.0       # concurrency: a client pacing its sends at this many requests/s (0: at once)

    def __post_init__(self):
        if self.kind not in (RATE, CONCURRENCY, MAX):
            raise ValueError(f"unknown load '{self.kind}'")
        if self.kind != MAX and not (self.value > 0 and math.isfinite(self.value)):
            raise ValueError(f"a {self.kind} load needs a finite value > 0")
        if not (self.send_rate >= 0 and math.isfinite(self.send_rate)):
            raise ValueError("a client's send rate must be finite and >= 0")


@dataclass(frozen=True)
class Limits:
    max_num_seqs: int
    max_batched_tokens: int
    kv_tokens: int               # KV-cache capacity of one replica, in tokens
    chunked_prefill: bool = True
    state_tokens: int = 0        # a request's recurrent state (hybrid / SSM models), in KV-token units
    attention_kv: bool = True    # False: a request's memory is its state only (no KV cache grows)
    output_kv_share: float = 1.0   # share of its output's KV a running request holds on average, as the engine
                                   # admits (serving/capacity.py KV_ADMISSION: vLLM 0.5, TensorRT-LLM 1)
    on_demand: OnDemandKV | None = None   # the engine allocates blocks as requests generate and preempts the
                                          # newest when they run out (serving/preemption.py); None: it admits a
                                          # request only with the blocks it counts for it, and never preempts
    prefill_apart: bool = False  # prefill steps run alone and the decodes wait (cost/engines.py ServingDefaults)


@dataclass
class SteadyState:
    stable: bool
    request_rate: float          # requests/s one replica completes
    running: float               # requests decoding, on average
    step_s: float
    ttft_s: dict = field(default_factory=dict)   # mean, p50, p90, p99
    tpot_s: float = 0.0
    e2e_s: dict = field(default_factory=dict)
    output_tokens_per_s: float = 0.0
    total_tokens_per_s: float = 0.0
    limited_by: str = "load"     # load | max_num_seqs | kv_cache | prefill budget
    note: str = ""
    tpot_q_s: dict = field(default_factory=dict)   # a request's TPOT: mean, p50, p90, p99
    queue_s: float = 0.0         # mean wait for a slot in the batch (all slots taken when it arrives)
    lengths: str = ""            # which lengths the answer used
    recompute_tokens: float = 0.0   # prefill tokens per request of preempted requests recomputed (full cache)


__all__ = ["CONCURRENCY", "MAX", "QUANTILES", "RATE", "Limits", "Load", "SteadyState"]
