"""The step a steady state settles on (serving/steady_state.py): the moments of an engine step while whole prompts
arrive beside the decodes, and the fixed point of Little's law in the step time.

`step(n, p)` is the engine step of `n` decoding requests and `p` prompt tokens (serving/step_cost.py
StepCost.steady, with the solve's chunk shape and contexts bound)."""
from __future__ import annotations

import math


def whole_prompt_moments(step, n: float, p: float, room: float, prompt: float, lumpy: bool,
                         spread: int) -> tuple[float, float]:
    """Mean and mean square of a step when prompts come whole: a step prefills the K prompts that arrived during
    the one before (K Poisson, or the two integers around its mean for evenly spaced arrivals), at most `room`
    tokens (the budget left by the decodes); what exceeds it fills the following steps, and a prompt longer than
    the budget fills whole chunk steps. Step time is convex in the tokens (flat while weight reads dominate), so
    the mean of steps exceeds the step of the mean; the square measures how much longer the step a request arrives
    in is (the inspection paradox). Prompts count at their mean length `prompt`; `p` is the mean prompt tokens a
    step carries. `lumpy`: arrivals vary (Poisson); `spread`: the engine takes every spread-th of them."""
    runs = [(0, 0, 0)]   # (steps, sum, sum of squares) of f full steps, summed in order: runs[f]

    def steps_of(tokens: float) -> tuple[int, float, float]:
        """(steps, their sum, their sum of squares) these prompt tokens take: whole steps of `room` tokens, then
        the rest (or one empty step)."""
        full, rest = divmod(tokens, room)
        f = int(full)
        while len(runs) <= f:
            a, (c, total, square) = step(n, room), runs[-1]
            runs.append((c + 1, total + a, square + a * a))
        c, total, square = runs[f]
        if rest > 0 or not f:
            t = step(n, rest)
            return c + 1, total + t, square + t * t
        return c, total, square

    def one(t: float) -> tuple[int, float, float]:
        return 1, t, t * t

    def mix(weighted):   # (weight, steps_of these prompts)
        count = sum(w * c for w, (c, _, _) in weighted)
        return (sum(w * total for w, (_, total, _) in weighted) / count,
                sum(w * square for w, (_, _, square) in weighted) / count)
    if p <= 0:
        return mix([(1.0, one(step(n, 0)))])
    if prompt >= room:
        f = min(1.0, p / room)
        return mix([(f, one(step(n, room))), (1 - f, one(step(n, 0)))])
    lam = p / prompt
    k = math.floor(lam)
    even = [(1 - (lam - k), steps_of(k * prompt)), (lam - k, steps_of((k + 1) * prompt))]
    weight = math.exp(-lam) if lam < 700 else 0.0
    if not lumpy or lam > 16 or weight == 0.0:   # many prompts per step: their count varies little
        return mix(even)
    terms, k = [], 0
    while k <= lam + 6 * math.sqrt(lam) + 6:
        terms.append((weight, steps_of(k * prompt)))
        k += 1
        weight *= lam / k
    # every spread-th request of a Poisson stream: counts vary 1/spread as much (a mix of the two)
    share = 1.0 / max(1, spread)
    return mix([(w * share, ts) for w, ts in terms] + [(w * (1 - share), ts) for w, ts in even])


def settled_step(after, s0: float) -> float:
    """The step time s with s = after(s) (the mean step at the batch and prefill that s implies), from the first
    guess s0. The mean step grows with s more slowly than s near a stable point, so a secant on s - after(s) finds
    it in a few evaluations; where the secant's slope says there is no stable point near (slope >= 1), or its step
    leaves the positive reals, a damped fixed-point step is taken instead; where that does not settle either, the
    lowest fixed point (lowest_fixed_point)."""
    f0 = after(s0)
    if abs(f0 - s0) <= 1e-6 * s0:
        return s0
    start = s0
    s1 = 0.5 * (s0 + f0)
    for _ in range(60):
        f1 = after(s1)
        if abs(f1 - s1) <= 1e-6 * s1:
            break
        slope = (f1 - f0) / (s1 - s0) if s1 != s0 else 1.0
        s2 = s1 + (f1 - s1) / (1.0 - slope) if slope < 0.95 else 0.5 * (s1 + f1)
        if not 0.0 < s2 < math.inf:
            s2 = 0.5 * (s1 + f1)
        s0, f0, s1 = s1, f1, s2
    else:
        if abs(after(s1) - s1) > 1e-6 * s1:
            s1 = lowest_fixed_point(after, start)
    return s1


def lowest_fixed_point(after, s: float) -> float:
    """The smallest s with after(s) = s, by bracketing and bisection: where the secant does not settle (near
    saturation, where the mean step grows almost as fast as s, or past it, where its iterates wander and its last
    one can sit anywhere below the admission limit). An engine filling up from empty stops at the lowest one; past
    saturation that is the capped batch (`after` must cap it, as the solve's shapes do, so that this ends), which
    the solve's feasibility check refuses."""
    lo, hi = s, s
    while after(lo) <= lo and lo > 1e-12:
        lo, hi = lo * 0.5, lo
    for _ in range(200):
        if after(hi) <= hi:
            break
        lo, hi = hi, hi * 2.0
    while hi - lo > 1e-7 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if after(mid) > mid else (lo, mid)
    return hi


__all__ = ["lowest_fixed_point", "settled_step", "whole_prompt_moments"]
