"""Serving setups as a Pareto frontier: throughput per GPU against speed per user (tokens/s/user = 1000 / TPOT),
the way serving benchmarks compare them. Independent of how the candidates were found: callers hand in points.

matplotlib is optional (the `plot` extra); without it `plot` warns once and writes nothing.
"""
from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

MIXED, DISAGG = "mixed", "disagg"
MODES = (MIXED, DISAGG)
MARKERS = {MIXED: "o", DISAGG: "^"}


@dataclass(frozen=True)
class ParetoPoint:
    """One serving setup's operating point."""
    label: str                    # what the user would deploy, e.g. "TP=2 DP=4 batch=64"
    mode: str                     # MIXED (prefill and decode share instances) or DISAGG
    tokens_per_s_per_gpu: float   # output tokens per second per GPU
    ttft_ms: float
    tpot_ms: float
    feasible: bool = True         # fits in memory and meets the latency limits
    hit_rate: float | None = None  # the prefix-cache hit rate it was priced at, when the caller varies it

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got '{self.mode}'")
        for name in ("tokens_per_s_per_gpu", "ttft_ms", "tpot_ms"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{self.label}: {name} must be a finite number >= 0, got {value}")
        if self.tpot_ms == 0:
            raise ValueError(f"{self.label}: tpot_ms must be > 0")

    @property
    def tokens_per_s_per_user(self) -> float:
        return 1000.0 / self.tpot_ms

    def as_json(self) -> dict:
        return dict(asdict(self), tokens_per_s_per_user=self.tokens_per_s_per_user)


def frontier(points: list[ParetoPoint]) -> list[ParetoPoint]:
    """The feasible points no other feasible point beats on both tokens/s/GPU and tokens/s/user, by tokens/s/user
    ascending. Points priced at different hit rates serve different workloads: compare them with `by_hit_rate`."""
    ordered = sorted((p for p in points if p.feasible), key=lambda p: (-p.tokens_per_s_per_user,
                                                                      -p.tokens_per_s_per_gpu))
    kept: list[ParetoPoint] = []
    for p in ordered:   # fastest per user first: a point survives if it beats every faster one per GPU
        if not kept or p.tokens_per_s_per_gpu > kept[-1].tokens_per_s_per_gpu or _same_spot(p, kept[-1]):
            kept.append(p)
    return kept[::-1]


def _distinct_labels(points: list[ParetoPoint]) -> list[ParetoPoint]:
    """One label per run of frontier points with the same layout (a layout swept over loads draws several)."""
    out = []
    for p in points:
        if not out or out[-1].label != p.label:
            out.append(p)
    return out


def _same_spot(a: ParetoPoint, b: ParetoPoint) -> bool:
    return (a.tokens_per_s_per_gpu, a.tpot_ms) == (b.tokens_per_s_per_gpu, b.tpot_ms)


def by_hit_rate(points: list[ParetoPoint]) -> dict[float | None, list[ParetoPoint]]:
    """Points grouped by the hit rate they were priced at (None: not given), rates ascending."""
    groups: dict[float | None, list[ParetoPoint]] = {}
    for p in sorted(points, key=lambda p: (p.hit_rate is not None, p.hit_rate or 0.0)):
        groups.setdefault(p.hit_rate, []).append(p)
    return groups


def usd_per_million(p: ParetoPoint, usd_per_gpu_hour: float) -> float:
    """Dollars per million output tokens at this point's throughput per GPU."""
    return usd_per_gpu_hour / (p.tokens_per_s_per_gpu * 3600) * 1e6


def plot(points: list[ParetoPoint], path: str | Path, ttft_limit_ms: float | None = None,
         tpot_limit_ms: float | None = None, title: str = "", usd_per_gpu_hour: float | None = None) -> bool:
    """Draw tokens/s/GPU against tokens/s/user for every feasible point, mixed and disaggregated with their own
    markers, one frontier line per hit rate with each frontier point labelled by its layout, the TPOT limit as a
    vertical line; with a price, a second panel draws $ per million output tokens against the same axis.
    True when the file was written."""
    path = Path(path)
    if not path.parent.is_dir():
        raise ValueError(f"cannot write plot {path}: folder {path.parent} does not exist")
    try:
        from matplotlib.figure import Figure
    except ImportError:
        print("warning: the Pareto plot needs matplotlib (pip install 'tracecost[plot]'); no plot written",
              file=sys.stderr)
        return False
    feasible = [p for p in points if p.feasible]
    groups = by_hit_rate(feasible)
    priced = usd_per_gpu_hour is not None and any(p.tokens_per_s_per_gpu > 0 for p in feasible)
    fig = Figure(figsize=(7, 7.5 if priced else 4.5))
    ax = fig.add_subplot(2, 1, 1) if priced else fig.add_subplot()
    money = fig.add_subplot(2, 1, 2, sharex=ax) if priced else None
    colors = ["C0", "C1", "C2", "C3", "C4", "C5", "C6", "C7", "C8", "C9"]
    for i, (rate, group) in enumerate(groups.items()):
        color = colors[i % len(colors)]
        name = "" if rate is None else f"hit rate {rate:g}, "
        for mode in MODES:
            chosen = [p for p in group if p.mode == mode]
            if chosen:
                ax.scatter([p.tokens_per_s_per_user for p in chosen], [p.tokens_per_s_per_gpu for p in chosen],
                           marker=MARKERS[mode], s=18, alpha=0.45, color=color, label=f"{name}{mode}")
        best = frontier(group)
        ax.plot([p.tokens_per_s_per_user for p in best], [p.tokens_per_s_per_gpu for p in best], color=color,
                linewidth=1.8, marker="o", markersize=3, label=f"{name}frontier")
        for p in _distinct_labels(best):
            ax.annotate(p.label, (p.tokens_per_s_per_user, p.tokens_per_s_per_gpu), fontsize=6, color=color,
                        xytext=(3, 3), textcoords="offset points")
        if money is not None:
            paid = [p for p in best if p.tokens_per_s_per_gpu > 0]
            money.plot([p.tokens_per_s_per_user for p in paid], [usd_per_million(p, usd_per_gpu_hour) for p in paid],
                       color=color, linewidth=1.8, marker="o", markersize=3, label=f"{name}frontier")
            for p in _distinct_labels(paid):
                money.annotate(p.label, (p.tokens_per_s_per_user, usd_per_million(p, usd_per_gpu_hour)), fontsize=6,
                               color=color, xytext=(3, 3), textcoords="offset points")
    if tpot_limit_ms is not None:
        ax.axvline(1000.0 / tpot_limit_ms, color="grey", linestyle="--", linewidth=1,
                   label=f"TPOT limit {tpot_limit_ms:g} ms")
    if not feasible:
        ax.text(0.5, 0.5, "no candidate meets the limits", transform=ax.transAxes, ha="center", va="center")
    (money or ax).set_xlabel("tokens/s/user (1000 / TPOT ms)")
    ax.set_ylabel("output tokens/s/GPU")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    if money is not None:
        money.set_ylabel(f"$ per million output tokens\n(${usd_per_gpu_hour:g} per GPU-hour)")
        money.set_ylim(bottom=0)
        money.grid(True, alpha=0.3)
    limits = [f"TTFT <= {ttft_limit_ms:g} ms"] if ttft_limit_ms is not None else []
    ax.set_title("\n".join(x for x in (title, ", ".join(limits)) if x), fontsize=9)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    try:
        fig.savefig(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot write plot {path}: {str(e).splitlines()[0]}") from None
    return True
