"""serving_sim's answer for people: the table of every run's metrics (hit rates, latency percentiles, throughput,
KV memory, the CPU tier, dollars), its warnings and notes, and the plot of the hit rate over time or over GPU cache
capacity (cli/inference/serving_sim.py computes the answer; --json prints it as is)."""
from __future__ import annotations

import sys

from serving.capacity import kv_admission_note
from tracer.table import format_table

from ..common import origin_notes, warn
from . import disagg_run


def _f(v, fmt="{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def _quantiles(d: dict, fmt="{:.1f}") -> str:
    return " / ".join(_f(d[k], fmt) for k in ("p50", "p90", "p99"))


def _pcts(d: dict) -> str:
    return _quantiles(d) if d["requests"] else "-"



ROWS = [  # (label, formatter of one run's summary)
    ("token hit rate", lambda r: f"{r['hit_rate'] * 100:.1f}%"),
    ("  from GPU / from CPU", lambda r: f"{r['hit_rate_by_tier']['gpu'] * 100:.1f}% / "
                                        f"{r['hit_rate_by_tier']['cpu'] * 100:.1f}%"),
    ("session hit rate p10 / p50 / p90", lambda r: "-" if r["session_hit_rate"]["p50"] is None else
        " / ".join(f"{r['session_hit_rate'][k] * 100:.0f}%" for k in ("p10", "p50", "p90"))
        + f" ({r['session_hit_rate']['sessions']})"),
    ("hit rate first / last window", lambda r: "-" if not r["hit_rate_over_time"]["points"] else
        f"{r['hit_rate_over_time']['points'][0]['hit_rate'] * 100:.1f}% / "
        f"{r['hit_rate_over_time']['points'][-1]['hit_rate'] * 100:.1f}% "
        f"({r['hit_rate_over_time']['window_s']:.3g} s)"),
    ("reused tokens", lambda r: f"{r['reused_tokens']:,}"),
    ("TTFT p50 / p90 / p99 ms", lambda r: _pcts(r["ttft_ms"])),
    ("  hit requests", lambda r: _pcts(r["ttft_ms_hit"]) + f" ({r['ttft_ms_hit']['requests']})"),
    ("  miss requests", lambda r: _pcts(r["ttft_ms_miss"]) + f" ({r['ttft_ms_miss']['requests']})"),
    ("TPOT p50 / p90 / p99 ms", lambda r: _quantiles(r["tpot_ms"], "{:.2f}")),
    ("ITL p50 / p90 / p99 ms", lambda r: _quantiles(r["itl_ms"], "{:.2f}")),
    ("E2E latency p50 / p90 / p99 ms", lambda r: _pcts(r["e2e_ms"])),
    ("mean TTFT / TPOT / E2E ms", lambda r: f"{_f(r['ttft_ms']['mean'])} / {_f(r['tpot_ms']['mean'], '{:.2f}')} / "
                                            f"{_f(r['e2e_ms']['mean'])}"),
    ("computed prefill tokens/s", lambda r: f"{r['computed_prefill_tokens_per_s']:,.0f}"),
    ("output tokens/s (per GPU)", lambda r: f"{r['output_tokens_per_s']:,.0f} "
                                            f"({r['output_tokens_per_s_per_gpu']:,.0f})"),
    ("total tokens/s (per GPU)", lambda r: f"{r['total_tokens_per_s']:,.0f} ({r['total_tokens_per_s_per_gpu']:,.0f})"),
    ("requests/s", lambda r: f"{r['request_rate']:.2f}"),
    ("GPU KV GB/instance used mean / peak", lambda r: f"{r['kv_memory_gb']['gpu_used_mean']:.1f} / "
                                             f"{r['kv_memory_gb']['gpu_used_peak']:.1f}"),
    ("  evictable mean / capacity", lambda r: f"{r['kv_memory_gb']['gpu_evictable_mean']:.1f} / "
                                                 f"{r['kv_memory_gb']['gpu_capacity']:.1f}"),
    ("evicted / re-needed blocks", lambda r: f"{r['evictions']['blocks']:,} / {r['evictions']['re_needed_blocks']:,}"),
    ("preemptions / recomputed tokens", lambda r: f"{r['preemptions']['count']:,} / "
                                                  f"{r['preemptions']['recomputed_tokens']:,}"),
    ("CPU KV GB mean / peak", lambda r: f"{r['kv_memory_gb']['cpu_mean']:.1f} / {r['kv_memory_gb']['cpu_peak']:.1f}"),
    ("CPU hit blocks / dropped blocks", lambda r: f"{r['cpu_tier']['hit_blocks']:,} / "
                                                  f"{r['cpu_tier']['dropped_blocks']:,}"),
    ("CPU load / compute saved ms", lambda r: f"{r['cpu_tier']['load_ms']:.1f} / "
                                              f"{r['cpu_tier']['saved_compute_ms']:.1f}"),
    ("GPU->CPU store ms (link busy)", lambda r: f"{r['cpu_tier']['store_ms']:.1f} "
                                                f"({r['cpu_tier']['store_link_busy'] * 100:.1f}%)"),
    ("completed / rejected", lambda r: f"{r['completed_requests']} / {r['rejected_requests']}"),
    ("overloaded (see warnings)", lambda r: "YES" if r["overload"] else "no"),
    ("$/hour; $/M output / total tokens", lambda r: "-" if not r.get("dollars") else
        f"{r['dollars']['usd_per_hour']:,.2f}; " + " / ".join(
            "-" if r["dollars"][k] is None else f"{r['dollars'][k]:,.3f}"
            for k in ("usd_per_million_output_tokens", "usd_per_million_total_tokens"))),
]


def render(out: dict) -> str:
    if "disaggregated" in out:
        text = (f"{out['model']} on {out['device']}, {out['engine']}, workload {out['workload']}, "
                f"{out['num_requests']} requests, {out['load']}\n" + disagg_run.render(out["disaggregated"]))
        text += "".join(f"\nwarning: {m}" for m in out["disaggregated"]["run"]["overload"])
        return text + f"\nnote: step overheads: {out['step_overheads']}\nnote: {out['price_note']}"
    runs = out["runs"]
    rows = [[label, *(fmt(r) for r in runs.values())] for label, fmt in ROWS]
    if out.get("speculation"):   # the accepted tokens the run drew per request per step
        rows.append(["tokens per step (drawn)", *(f"{r['tokens_per_step'] or 0:.2f}" for r in runs.values())])
    if out["instances"] > 1:
        rows.append([f"hit rate per instance ({out['routing']})",
                     *(" ".join(f"{i['hit_rate'] * 100:.0f}%" for i in r["instances"]) for r in runs.values())])
    title = (f"{out['model']} on {out['device']} (TP={out['tp_size']}) x {out['instances']}, {out['engine']}, "
             f"workload {out['workload']}, {out['num_requests']} requests, {out['load']}, {out['cache_policy']} "
             f"cache, block size {out['block_size']}")
    if out.get("lengths"):
        title += f"\n{out['lengths']}"
    text = format_table(["metric", *runs.keys()], rows, title=title)
    if "sweep" in out:
        text += "\n\n" + format_table(
            ["GPU cache GB", "token hit rate", "TTFT p50 ms", "evicted blocks", "preemptions"],
            [[f"{s['gpu_cache_gb']:g}", f"{s['hit_rate'] * 100:.1f}%", _f(s["ttft_ms_p50"]),
              f"{s['evicted_blocks']:,}", f"{s['preemptions']:,}"] for s in out["sweep"]],
            title="hit rate vs GPU cache capacity")
    for message in sorted({m for r in runs.values() for m in r["overload"]}):
        text += f"\nwarning: {message}"
    if out.get("speculation"):
        text += (f"\nnote: {out['speculation']} (each request's accepted tokens drawn per step, position by "
                 f"position, seeded; 'tokens per step' is what the run drew)")
    for note in origin_notes(out["origin"]) + out.get("pricing_notes", []):
        text += f"\nnote: {note}"
    if out.get("scheduling"):
        text += f"\nnote: {out['scheduling']}"
    admission = out.get("kv_admission") and kv_admission_note(out["engine"], out["kv_admission"])
    if admission:
        text += f"\nnote: {admission}"
    text += f"\nnote: {out['price_note']}"
    return (out["origin"]["headline"] + "\n" if out["origin"]["headline"] else "") + text


def write_plot(out: dict, path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        warn("--plot needs matplotlib (pip install 'tracecost[plot]'); no plot written")
        return
    if "sweep" in out:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([s["gpu_cache_gb"] for s in out["sweep"]], [s["hit_rate"] * 100 for s in out["sweep"]], marker="o")
        ax.set_xscale("log", base=2)
        ax.set_xticks([s["gpu_cache_gb"] for s in out["sweep"]], [f"{s['gpu_cache_gb']:g}" for s in out["sweep"]])
        ax.set_ylim(bottom=0)
        ax.set_xlabel("GPU KV cache per instance (GB)")
        ax.set_ylabel("token hit rate (%)")
    else:
        fig, (ax, ax2) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
        for label, r in out["runs"].items():
            pts = r["hit_rate_over_time"]["points"]
            ax.plot([p["t_s"] for p in pts], [p["hit_rate"] * 100 for p in pts], label=label)
            ax2.plot([p["t_s"] for p in pts], [p["ttft_p50_ms"] for p in pts], label=label)
        ax.set_ylabel("token hit rate (%)")
        ax.set_ylim(bottom=0)
        ax2.set_ylabel("TTFT p50 (ms)")
        ax2.set_xlabel("time (s)")
        ax.legend()
    ax.set_title(f"{out['model']} on {out['device']}, {out['workload']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    print(f"wrote {path}", file=sys.stderr)


__all__ = ["ROWS", "render", "write_plot"]
