"""Where requests come from: the one place arrival times are decided.

Open loop: each request arrives at its own arrival_s (a preset's Poisson process, or a trace's
timestamps scaled by --time-scale). A closed-loop source (a fixed number of users, each sending again when
answered) plugs in here through on_finish.
"""
from __future__ import annotations

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
