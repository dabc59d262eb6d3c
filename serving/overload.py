"""Loads a deployment cannot serve, said out loud: every CLI puts these in its table and its `warnings`.

- open loop: the offered request rate is beyond what is served (the rest piles up in the queue);
- a simulated queue that grows for the whole run: each quarter of the arrivals waits longer for a slot than the
  one before, the last one long (it has no steady state; its percentiles grow with the run's length);
- closed loop: more users than the deployment runs at once (max_num_seqs x replicas); the rest wait in the
  queue and their TTFT is that wait.
"""
from __future__ import annotations

import statistics

SERVED_SHARE = 0.9        # served below this share of the offered rate: overloaded
QUEUE_WAIT_S = 1.0        # a last quarter waiting longer than this (and twice the first quarter's): growing queue
QUARTERS = 4


def rate_beyond_served(offered: float, served: float, where: str = "") -> str | None:
    if offered <= 0 or served >= SERVED_SHARE * offered:
        return None
    return (f"overload{where}: {offered:.3g} requests/s offered, {served:.3g} served ({served / offered:.0%}); "
            f"the rest queue without bound")


def users_beyond_slots(users: int, slots: int, where: str = "") -> str | None:
    if users <= slots:
        return None
    return (f"overload{where}: {users:,} concurrent users, at most {slots:,} running at once (max_num_seqs x "
            f"replicas); {users - slots:,} always wait, their TTFT is that wait")


def offered_rate(arrivals: list[float]) -> float | None:
    """Requests/s of an arrival sequence; None for a burst (every request at once)."""
    if len(arrivals) < 2:
        return None
    span = max(arrivals) - min(arrivals)
    return (len(arrivals) - 1) / span if span > 0 else None


def growing_queue(arrivals: list[float], admits: list[float], where: str = "") -> str | None:
    """Waits for a slot (admission - arrival), by quarters of the arrival order."""
    if len(arrivals) < 4 * QUARTERS:
        return None
    waits = [a - t for t, a in sorted(zip(arrivals, admits))]
    n = len(waits)
    means = [statistics.fmean(waits[i * n // QUARTERS:(i + 1) * n // QUARTERS]) for i in range(QUARTERS)]
    rising = all(b > a for a, b in zip(means, means[1:]))
    if not (rising and means[-1] > QUEUE_WAIT_S and means[-1] > 2 * means[0]):
        return None
    return (f"overload{where}: the queue grows for the whole run (mean wait for a slot by quarter of the "
            f"arrivals: " + " / ".join(f"{m:.3g}" for m in means) + " s)")


def simulated(records, requests: list, users: int | None = None, slots: int | None = None,
              where: str = "") -> list[str]:
    """What a simulation's records say: offered beyond served, a growing queue, users beyond slots.
    `records` have arrival_s, admit_s and finish_s; `requests` are everything that was sent."""
    out = []
    if users is not None and slots is not None:
        out.append(users_beyond_slots(users, slots, where))
    else:
        offered = offered_rate([r.arrival_s for r in requests])
        finishes = [r.finish_s for r in records]
        if offered is not None and len(finishes) > 1 and max(finishes) > min(finishes):
            # completions per second between the first and the last: the arrivals' pace shifted by a latency
            # when the deployment keeps up, its capacity when it does not
            served = (len(finishes) - 1) / (max(finishes) - min(finishes))
            out.append(rate_beyond_served(offered, served, where))
    if records:
        out.append(growing_queue([r.arrival_s for r in records], [r.admit_s for r in records], where))
    return [m for m in out if m]


__all__ = ["growing_queue", "offered_rate", "rate_beyond_served", "simulated", "users_beyond_slots"]
