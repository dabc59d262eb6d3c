"""Where requests come from: the one place arrival times are decided, as benchmark clients define load.

Open loop: each request arrives at its own arrival_s (a preset's Poisson or evenly spaced arrivals, a
trace's timestamps scaled by --time-scale, or all at 0 for maximum throughput). Closed loop: a fixed
number of users, each sending its next request the moment its previous one is answered.
"""
from __future__ import annotations

import heapq
from collections import deque

from .workload import SimRequest


class OpenLoopArrivals:
    def __init__(self, requests: list[SimRequest]):
        self._pending = deque(sorted(requests, key=lambda r: r.arrival_s))

    def next_time(self) -> float | None:
        return self._pending[0].arrival_s if self._pending else None

    def pop(self) -> SimRequest:
        return self._pending.popleft()

    def on_finish(self, request: SimRequest, now: float) -> None:
        """An open loop does not react to completions."""


class ClosedLoopArrivals:
    """`users` clients: the first requests go out at 0, then each answer releases the next request."""

    def __init__(self, requests: list[SimRequest], users: int):
        self._pending = deque(requests)
        self._scheduled: list = []
        for _ in range(min(users, len(requests))):
            self._send(self._pending.popleft(), 0.0)

    def _send(self, request: SimRequest, now: float) -> None:
        request.arrival_s = now
        heapq.heappush(self._scheduled, (now, request.rid, request))

    def next_time(self) -> float | None:
        return self._scheduled[0][0] if self._scheduled else None

    def pop(self) -> SimRequest:
        return heapq.heappop(self._scheduled)[2]

    def on_finish(self, request: SimRequest, now: float) -> None:
        if self._pending:
            self._send(self._pending.popleft(), now)
