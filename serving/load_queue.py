"""The running batch of a continuous-batching engine under open-loop load, as a birth-death chain.

The engine admits greedily: a request arriving to fewer than K running (max_num_seqs, or the requests the KV
cache holds) starts at once, else it queues until a slot frees. With N requests in the engine and its queue,
min(N, K) run, each step takes s(m) at m running, and a request holds its slot for its prompt's step and its
O - 1 decode steps, so requests leave at m / (O s(m)) per second. Arrivals at rate R make N a birth-death chain
(its stationary law a product of R / departure rates); at N >= K the departure rate is constant, so the queue
is geometric and a queued request waits an exponential time (Erlang C):

    P(wait > t) = P(N >= K) exp(-(K / (O s(K)) - R) t)

Arrivals less variable than Poisson (every k-th request of a stream, or evenly spaced) have a peakedness z < 1:
the variance of N over its mean (Whitt's infinite-server peakedness, z = 1 + (c_a^2 - 1) h with h = 1/2 for
exponential residence and 1 for fixed residence). Hayward's approximation runs the chain in units of z
requests, at rate R / z with K / z slots: same mean, variance z times the mean.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

# a request's TPOT is the mean of its steps over its life, not one step: the batch it decodes in changes on the
# time scale of its own residence (the chain's relaxation time), and the average of a stationary process with
# that correlation time over one correlation time keeps 2/e of its variance (Ornstein-Uhlenbeck)
LIFE_AVERAGE_VARIANCE = 2 / math.e
MIN_PEAKEDNESS = 0.1        # below it the batch is steady: the deterministic fixed point


@dataclass(frozen=True)
class BatchLaw:
    """The stationary running batch: (probability, running requests) points and the admission queue."""
    points: tuple[tuple[float, float], ...]   # (time share, running) for the states below and at the cap
    queued: float                              # P(all K slots taken) an arrival sees
    wait_rate: float                           # 1/s: a queued request's wait is exponential at this rate
    stable: bool
    grid: tuple[int, ...] = ()                 # the running counts the step was priced at

    @property
    def mean_running(self) -> float:
        return sum(w * m for w, m in self.points)

    @property
    def mean_wait(self) -> float:
        return self.queued / self.wait_rate if self.wait_rate > 0 else math.inf

    @property
    def admission(self) -> "Wait":
        """A request's wait for a slot: queued with probability `queued`, then exponential (Erlang C)."""
        return Wait.exponential(self.queued, self.wait_rate)


def peakedness(arrival_variation: float, residence_variation: float) -> float:
    """z of an infinite-server queue (Whitt): arrivals' squared CV c_a^2, residence squared CV c_s^2."""
    h = min(1.0, max(0.5, 1.0 - residence_variation / 2))
    return max(0.0, 1.0 + (arrival_variation - 1.0) * h)


def batch_law(rate: float, slots: int, residence_steps: float, step_at, z: float, cells: int = 48) -> BatchLaw:
    """The chain's law at `rate` (requests/s) with `slots` slots; `step_at(m)`: mean step seconds with m
    running; a request stays `residence_steps` steps. Returns the (share, running) points grouped into at most
    `cells` cells of the running count."""
    z = max(MIN_PEAKEDNESS, z)
    units = max(1, int(slots / z))           # the cap in units of z requests
    grid = sorted({slots, 1} | {max(1, round(slots * (k / 16) ** 2)) for k in range(1, 17)})
    step_grid = np.array([step_at(m) for m in grid])
    m = np.minimum(np.arange(1, units + 1) * z, slots)
    steps = np.interp(m, grid, step_grid)
    departures = np.arange(1, units + 1) / (residence_steps * steps)    # units of z requests per second
    arrivals = rate / z
    log_pi = np.concatenate([[0.0], np.cumsum(np.log(arrivals / departures))])
    log_pi -= log_pi.max()
    pi = np.exp(log_pi)                      # states 0..units
    full = departures[-1]
    rho = arrivals / full
    stable = rho < 1
    tail = pi[-1] * rho / (1 - rho) if stable else math.inf
    total = pi.sum() + tail
    if not stable or not math.isfinite(total):
        return BatchLaw(((1.0, float(slots)),), 1.0, 0.0, False, tuple(grid))
    pi /= total
    running = np.concatenate([[0.0], m])
    shares = pi.copy()
    shares[-1] += tail / total               # every state with a queue runs the full batch
    queued = float(pi[-1] / (1 - rho))
    points = _cells(shares, running, cells)
    return BatchLaw(points, min(1.0, queued), float(full - arrivals), True, tuple(grid))


def _cells(shares: np.ndarray, running: np.ndarray, cells: int) -> tuple[tuple[float, float], ...]:
    """Group states into cells of about equal probability (the full-batch state kept apart)."""
    order = np.cumsum(shares)
    edges = np.minimum((order * cells).astype(int), cells - 1)
    out = []
    for c in np.unique(edges[:-1]):
        sel = edges[:-1] == c
        w = shares[:-1][sel].sum()
        if w > 0:
            out.append((float(w), float((shares[:-1][sel] * running[:-1][sel]).sum() / w)))
    out.append((float(shares[-1]), float(running[-1])))
    return tuple(p for p in out if p[0] > 1e-12)


@dataclass(frozen=True)
class Wait:
    """A wait that is zero with probability 1 - `present`, else the sum of independent exponential stages at
    `rates` (1/s each): one stage is the exponential tail of a queue, several a wait less variable than that."""
    present: float
    rates: tuple[float, ...] = ()

    @classmethod
    def exponential(cls, present: float, rate: float) -> "Wait":
        return cls(present, (rate,))

    @property
    def mean(self) -> float:
        if self.present <= 0 or not self.rates or not all(r > 0 for r in self.rates):
            return 0.0
        return self.present * sum(1 / r for r in self.rates)


NO_WAIT = Wait(0.0)


def wait_tail_terms(waits: list[Wait]) -> list[tuple[float, float]]:
    """The exponentials [(weight, rate)] whose sum is P(W > t), for W the sum of independent waits. Over each
    subset of the waits present, the sum of their stages has the hypoexponential tail sum_i exp(-theta_i t)
    prod_(j != i) theta_j / (theta_j - theta_i) (equal rates are parted by a thousandth, which moves no quantile
    that matters)."""
    waits = [w for w in waits if w.mean > 0 and all(math.isfinite(r) for r in w.rates)]
    terms = []
    for present in itertools.product((False, True), repeat=len(waits)):
        p = math.prod(w.present if on else 1 - w.present for w, on in zip(waits, present))
        rates = sorted(r for w, on in zip(waits, present) if on for r in w.rates)
        if not rates or p == 0:
            continue
        for k in range(1, len(rates)):
            rates[k] = max(rates[k], rates[k - 1] * (1 + 1e-3))
        for i, ti in enumerate(rates):
            terms.append((p * math.prod(tj / (tj - ti) for j, tj in enumerate(rates) if j != i), ti))
    return terms


def _tail(t: np.ndarray, terms: list[tuple[float, float]]) -> np.ndarray:
    t = np.maximum(t, 0.0)
    above = np.zeros_like(t)
    for weight, rate in terms:
        above = above + weight * np.exp(-rate * t)
    return np.clip(above, 0.0, 1.0)


def waits_above(t: np.ndarray, waits: list[Wait]) -> np.ndarray:
    """P(W > t) for the waits of `wait_tail_terms`."""
    return _tail(t, wait_tail_terms(waits))


def ttft_quantiles(classes: list[tuple[float, float]], residual_s: float, waits: list[Wait],
                   qs=(50, 90, 99)) -> dict:
    """Quantiles of c + U residual + W over classes (weight, c): U uniform on [0, 1) (the step under way), W
    the waits of `wait_tail_terms`."""
    w = np.array([c[0] for c in classes])
    w = w / w.sum()
    base = np.array([c[1] for c in classes])
    u = (np.arange(16) + 0.5) / 16 * residual_s

    terms = wait_tail_terms(waits)      # constant over t: the inversion below evaluates the cdf ~50 times

    def cdf(t: float) -> float:
        x = t - base[:, None] - u[None, :]
        below = np.where(x >= 0, 1.0 - _tail(x, terms), 0.0)
        return float((w[:, None] * below).sum() / len(u))

    return {f"p{q}": _invert(cdf, q / 100, float(base.min()), float(base.max()) + residual_s) for q in qs}


def normal_mix_quantiles(components: list[tuple[float, float, float]], qs=(50, 90, 99)) -> dict:
    """Quantiles of a mixture of normals [(weight, mean, std)]."""
    w = np.array([c[0] for c in components])
    w = w / w.sum()
    mu = np.array([c[1] for c in components])
    sd = np.maximum(np.array([c[2] for c in components]), 1e-12)
    def erf(x: np.ndarray) -> np.ndarray:   # math.erf per component (np.vectorize's own overhead was 10x this)
        return np.array([math.erf(v) for v in x.tolist()])

    def cdf(t: float) -> float:
        return float((w * 0.5 * (1 + erf((t - mu) / (sd * math.sqrt(2))))).sum())

    lo, hi = float((mu - 6 * sd).min()), float((mu + 6 * sd).max())
    return {f"p{q}": _invert(cdf, q / 100, max(0.0, lo), hi) for q in qs}


def _invert(cdf, q: float, lo: float, hi: float) -> float:
    span = max(hi - lo, 1e-9)
    while cdf(hi) < q and span < 1e9:
        hi, span = hi + span, span * 2
    for _ in range(50):
        mid = (lo + hi) / 2
        if cdf(mid) < q:
            lo = mid
        else:
            hi = mid
    return hi


__all__ = ["BatchLaw", "LIFE_AVERAGE_VARIANCE", "MIN_PEAKEDNESS", "NO_WAIT", "Wait", "batch_law",
           "normal_mix_quantiles", "peakedness", "ttft_quantiles", "wait_tail_terms", "waits_above"]
