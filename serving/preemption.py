"""What an engine that allocates KV as requests generate pays once its cache is full: preempted requests recomputed.

vLLM (and TensorRT-LLM's max_utilization scheduler) admit a waiting request once its prompt's blocks are free, and
give a running request a block whenever its tokens outgrow the ones it holds. A step whose growth finds no free
block preempts the newest running request: its blocks are freed and it is recomputed from its prompt when it
resumes (vllm/v1/core/sched/scheduler.py schedule(): running requests are scheduled first, the waiting ones only
in a step that preempted nobody; KVCacheManager.allocate_slots). With requests waiting, greedy admission leaves
less than the next prompt's blocks free, so a step in which nothing completes is short of blocks about as often
as its growth exceeds what is left. Per step, in blocks of b tokens, with n running requests that gain a tokens
a step, prompts of I tokens and outputs of O:

    growth     G ~ Poisson(n a / b)           (each request opens a block every b / a steps, out of phase)
    freed      X = W x Poisson(n a / O)       W = (I + O) / b + 1/2, a completed request's blocks
    free       F ~ Uniform[0, A)              A = (I + k) / b + 1/2, the next prompt's blocks
    victims    ceil(max(0, G - F - X) / V)    V = (I + O / 2 + k) / b + 1/2, a running request's blocks

where k is the slots a running request holds beyond its tokens (a speculative step's k drafts). Each victim
recomputes the tokens it had computed, I + O / 2 on average: the newest request resumes last and is the next
victim again, so the one preempted holds, over the run, what a running request holds on average. Its own blocks
are recomputed even with prefix caching (vLLM frees a victim's blocks to the free queue's tail, and the growth of
the steps it waits takes them before it resumes); a prefix other requests hold is hit again.

Not modelled: the victim's own delay (it waits at the queue's head for a step that preempts nobody), and SGLang's
retraction (its admission reserves new_token_ratio of the output, so it retracts rarely).
"""
from __future__ import annotations

import math
from dataclasses import dataclass


def _poisson(mean: float, tail: float = 8.0) -> list[tuple[int, float]]:
    """(count, probability) of a Poisson count, over the counts that carry its mass."""
    if mean <= 0:
        return [(0, 1.0)]
    lo, hi = max(0, int(mean - tail * math.sqrt(mean) - 2)), int(mean + tail * math.sqrt(mean) + 4)
    log_p = -mean + lo * math.log(mean) - math.lgamma(lo + 1)
    terms = []
    for c in range(lo, hi + 1):
        terms.append((c, math.exp(log_p)))
        log_p += math.log(mean) - math.log(c + 1)
    return terms


def _ceil_integral(x: float, v: float) -> float:
    """The integral of ceil(u / v) du over [0, x], x >= 0."""
    m = math.floor(x / v)
    return v * m * (m + 1) / 2 + (m + 1) * (x - m * v)


@dataclass(frozen=True)
class OnDemandKV:
    """An engine's KV admission when it allocates blocks as requests generate and preempts the newest when out."""
    block_tokens: int            # tokens per KV block
    spare_slots: int = 0         # slots a running request holds beyond its tokens: the drafts its next
                                 # verification writes (serving/speculative.py, k)

    @property
    def slack_tokens(self) -> float:
        """Tokens a running request holds beyond its own, on average: half a block, and its spare slots."""
        return self.block_tokens / 2 + self.spare_slots

    def _blocks(self, tokens: float) -> float:
        return tokens / self.block_tokens + 0.5

    def preemptions_per_step(self, running: float, tokens_per_step: float, prompt: float, output: float) -> float:
        """Requests preempted per step of a full cache with requests waiting (the module's docstring)."""
        if running <= 0 or output <= 0:
            return 0.0
        k = self.spare_slots
        freed_each = self._blocks(prompt + output)
        room = self._blocks(prompt + k)
        victim = self._blocks(prompt + output / 2 + k)
        growth = _poisson(running * tokens_per_step / self.block_tokens)
        total = 0.0
        for done, p_done in _poisson(running * tokens_per_step / output):
            freed = done * freed_each
            for grown, p_grown in growth:
                short = grown - freed
                if short <= 0:
                    continue
                # E over F ~ U[0, A) of ceil(max(0, short - F) / V)
                victims = (_ceil_integral(short, victim) - _ceil_integral(max(0.0, short - room), victim)) / room
                total += p_done * p_grown * victims
        return total

    def recompute_tokens(self, running: float, tokens_per_step: float, prompt: float, output: float,
                         cached: float = 0.0) -> float:
        """Tokens recomputed per completed request: its share of the victims, each recomputing the tokens it had
        computed (its prompt and half its output on average), less the `cached` prefix it hits again."""
        completions = running * tokens_per_step / output if output > 0 else 0.0
        if completions <= 0:
            return 0.0
        computed = max(0.0, prompt - cached) + output / 2
        return self.preemptions_per_step(running, tokens_per_step, prompt, output) / completions * computed
