"""The HTTP server in front of an engine, as its requests see it: one event loop that takes each request in (parse,
render, tokenize, hand to the engine) with `work_s` of CPU time, in several steps separated by awaits.

The loop runs every callback that is ready before it resumes one that awaited, so the requests it holds advance
a step each in turn: a processor-sharing queue. Everything it holds shares its time evenly, and each request
reaches the engine when its own work is done. A burst of N arrives together, advances together and reaches the
engine together, N x work_s after it came; a light stream meets an idle server and waits work_s alone; at a
utilization rho the mean time in the server is work_s / (1 - rho) (M/G/1 processor sharing).

Both the walk of a finite run (serving/steady_state.py) and the event simulation (serving/simulator.py) move
requests through this one queue.
"""
from __future__ import annotations

import math
from collections import deque

from .load_queue import NO_WAIT, Wait


class ServerIntake:
    """Processor sharing in virtual time: `v` is the work each held request has received since the queue began,
    growing at 1 / (requests held) per second. A request that comes at virtual time v leaves at v + work_s, so
    requests leave in the order they came."""

    def __init__(self, work_s: float):
        self.work_s = work_s
        self.t = 0.0
        self.v = 0.0
        self.held: deque = deque()      # (virtual time it leaves at, item), in arrival order

    def __len__(self) -> int:
        return len(self.held)

    def _advance(self, t: float) -> None:
        if self.held:
            self.v += (t - self.t) / len(self.held)
        self.t = max(self.t, t)

    def next_departure(self) -> float | None:
        """When the next request is done (None: the server is idle); valid until the next arrival."""
        return self.t + (self.held[0][0] - self.v) * len(self.held) if self.held else None

    def arrive(self, t: float, item) -> None:
        """A request comes at `t`; every departure before `t` must have been taken first."""
        self._advance(t)
        self.held.append((self.v + self.work_s, item))

    def depart(self, t: float) -> list:
        """The requests done at `t` (the time next_departure gave), in arrival order."""
        self._advance(t)
        done, eps = [], 1e-9 * max(1.0, abs(self.v))
        while self.held and self.held[0][0] <= self.v + eps:
            done.append(self.held.popleft()[1])
        return done


def server_entries(arrivals: list[float], work_s: float) -> list[float]:
    """When each request, arriving at `arrivals` (any order), reaches the engine through the server."""
    queue, entries = ServerIntake(work_s), [math.nan] * len(arrivals)

    def take_until(limit: float) -> None:
        while (done_at := queue.next_departure()) is not None and done_at <= limit:
            for j in queue.depart(done_at):
                entries[j] = done_at

    for i in sorted(range(len(arrivals)), key=arrivals.__getitem__):
        take_until(arrivals[i])
        queue.arrive(arrivals[i], i)
    take_until(math.inf)
    return entries


def shared_wait(rho: float, work_s: float) -> Wait:
    """A Poisson stream at utilization `rho`: the time a request spends in the server beyond its own work_s.

    It shares the server unless the server was idle when it came and no other came within its work_s:
    C = 1 - (1 - rho) e^-rho. Its mean is processor sharing's, work_s / (1 - rho) in all. When it shares with one
    other request, its delay is that one's remaining work or its own, uniform on (0, work_s): a squared coefficient
    of variation of 1/3. The more requests overlap, the nearer the delay comes to the exponential of a busy queue
    (1), in proportion to the chance of sharing at all: 1 - 2/3 (1 - C). The delay is the sum of exponential
    stages with that mean and variation (against the queue drawn at rho 0.05-0.85: p90 and p99 within 5%; an
    exponential put the p99 6-30% high at rho 0.05-0.3)."""
    if rho <= 0 or work_s <= 0:
        return NO_WAIT
    shares = 1 - (1 - rho) * math.exp(-rho)
    mean = work_s * rho / (1 - rho) / shares          # given that it shares
    variation = 1 - 2 / 3 * (1 - shares)
    return Wait(shares, tuple(1 / (mean * part) for part in _stage_means(variation)))


def _stage_means(variation: float) -> list[float]:
    """Shares of the mean for the fewest exponential stages whose sum has squared coefficient of variation
    `variation` (>= 1/3): k - 1 equal stages and one longer."""
    k = max(1, math.ceil(1 / variation - 1e-9))
    if k == 1:
        return [1.0]
    equal = (1 - math.sqrt(max(0.0, 1 - k * (1 - variation) / (k - 1)))) / k
    return [equal] * (k - 1) + [1 - (k - 1) * equal]
