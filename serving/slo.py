"""Latency limits as users state them: a statistic (mean or a percentile) per metric, a margin kept below each
limit, and goodput, the requests per second that finish within every limit (vLLM's `vllm bench serve
--goodput ttft:MS tpot:MS`, vllm/benchmarks/serve.py: a request counts when each of its metrics is at or
under its limit)."""
from __future__ import annotations

from dataclasses import dataclass

STATS = ("mean", "p50", "p90", "p99")
# the quantiles the steady state and the simulator report, as (probability, key)
_QUANTILES = ((0.5, "p50"), (0.9, "p90"), (0.99, "p99"))


@dataclass(frozen=True)
class LatencyLimits:
    ttft_ms: float | None = None      # as the user stated them
    tpot_ms: float | None = None
    stat: str = "mean"                # which TTFT and TPOT statistic the limits apply to
    headroom: float = 0.0             # candidates must stay this share below each limit

    def __post_init__(self):
        if self.stat not in STATS:
            raise ValueError(f"limit statistic must be one of {', '.join(STATS)}, got '{self.stat}'")
        if not 0.0 <= self.headroom < 1.0:
            raise ValueError(f"--headroom must be in [0, 1), got {self.headroom}")

    @property
    def ttft_target_ms(self) -> float | None:
        return None if self.ttft_ms is None else self.ttft_ms * (1 - self.headroom)

    @property
    def tpot_target_ms(self) -> float | None:
        return None if self.tpot_ms is None else self.tpot_ms * (1 - self.headroom)

    @property
    def any(self) -> bool:
        return self.ttft_ms is not None or self.tpot_ms is not None

    def why_not(self, ttft_ms: dict, tpot_ms: float, tpot_stats_ms: dict | None = None) -> list[str]:
        """`tpot_stats_ms`: a request's TPOT percentiles (mean, p50, p90, p99); without them the limit applies
        to `tpot_ms` whatever the statistic (a decode pool's steady batch)."""
        out = []
        margin = f" (limit {{:g}} less {self.headroom:.0%} headroom)" if self.headroom else ""
        ttft, tpot_target = self.ttft_target_ms, self.tpot_target_ms
        if ttft is not None and ttft_ms.get(self.stat) is not None and ttft_ms[self.stat] > ttft:
            out.append(f"TTFT {self.stat} {ttft_ms[self.stat]:.1f} ms > {ttft:g} ms" + margin.format(self.ttft_ms))
        tpot, stat = (tpot_stats_ms[self.stat], f" {self.stat}") if tpot_stats_ms else (tpot_ms, "")
        if tpot_target is not None and tpot is not None and tpot > tpot_target:
            out.append(f"TPOT{stat} {tpot:.2f} ms > {tpot_target:g} ms" + margin.format(self.tpot_ms))
        return out

    def as_json(self) -> dict:
        return {"ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms, "stat": self.stat, "ttft_stat": self.stat,
                "headroom": self.headroom, "ttft_target_ms": self.ttft_target_ms,
                "tpot_target_ms": self.tpot_target_ms}


def share_within(quantiles: dict, limit: float | None) -> float:
    """P(X <= limit) from a distribution's p50, p90 and p99: linear between them, from 0 at p50 - (p90 - p50)
    below, to 1 at p99 + (p99 - p90) above (tails past the reported quantiles are not known)."""
    if limit is None:
        return 1.0
    points = [(quantiles.get(k), p) for p, k in _QUANTILES]
    if any(v is None for v, _ in points):       # no spread known: the mean decides
        mean = quantiles.get("mean")
        return 1.0 if mean is None or mean <= limit else 0.0
    (q50, _), (q90, _), (q99, _) = points
    knots = [(max(0.0, q50 - (q90 - q50)), 0.0), (q50, 0.5), (q90, 0.9), (q99, 0.99), (q99 + (q99 - q90), 1.0)]
    if limit < knots[0][0]:
        return 0.0
    for (x0, p0), (x1, p1) in zip(knots, knots[1:]):
        if limit <= x1:
            return p1 if x1 <= x0 else p0 + (p1 - p0) * (limit - x0) / (x1 - x0)
    return 1.0


def goodput_estimate(request_rate: float, ttft_ms: dict, tpot_stats_ms: dict, limits: LatencyLimits) -> float:
    """Requests/s within both limits (at face value, without headroom), from the model's percentiles; the two
    metrics are taken as independent (congestion raises both, so this errs low)."""
    return request_rate * share_within(ttft_ms, limits.ttft_ms) * share_within(tpot_stats_ms, limits.tpot_ms)


def goodput_of(ttfts_ms: list[float], tpots_ms: list[float | None], seconds: float, limits: LatencyLimits) -> float:
    """Requests/s within both limits, counted request by request (a one-token request has no TPOT to fail)."""
    if seconds <= 0:
        return 0.0
    good = sum(1 for ttft, tpot in zip(ttfts_ms, tpots_ms)
               if (limits.ttft_ms is None or ttft <= limits.ttft_ms)
               and (limits.tpot_ms is None or tpot is None or tpot <= limits.tpot_ms))
    return good / seconds


__all__ = ["LatencyLimits", "STATS", "goodput_estimate", "goodput_of", "share_within"]
