"""The optimizer's result as text: one table of candidates that fits 120 columns (`--wide` adds the rest), the
simulator's check of the top candidates beside it, the best candidate, notes."""
from __future__ import annotations

import re

from serving.capacity import kv_admission_note
from serving.search import DISAGG, MAX, RATE
from tracer.table import format_table

WIDTH = 120


def layout_text(c: dict) -> str:
    """TP2 DP4 (mixed), P1xTP2 D3xTP4 (disaggregated prefill and decode pools)."""
    def one(d: dict) -> str:
        s = f"TP{d['tp_size']}"
        if d["pp_size"] > 1:
            s += f" PP{d['pp_size']}"
        if d["ep_size"] > 1:
            s += f" EP{d['ep_size']}"
        return s
    if c["mode"] == DISAGG:
        return f"P{c['prefill']['instances']}x{one(c['prefill'])} D{c['decode']['instances']}x{one(c['decode'])}"
    spec = f" +{c['speculation']}" if c.get("speculation") else ""
    return one(c) + (f" ADP{c['dp_size']}" if c["attention_dp"] else f" DP{c['dp_size']}") + spec


def ms(v: float | None) -> str:
    """Three significant digits, no exponent: 0.523, 5.23, 52.3, 523, 5230."""
    if v is None:
        return "-"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def spread(stats: dict, stat: str) -> str:
    """`stat | p50/p90/p99` (or just the percentiles when the limits use one of them); a decode pool's TPOT is
    its steady batch's step, the same for every request."""
    if stats.get("p50") is None:
        return f"{ms(stats.get('mean'))} (all)"
    pct = "/".join(ms(stats.get(k)) for k in ("p50", "p90", "p99"))
    return pct if stat != "mean" else f"{ms(stats.get('mean'))}|{pct}"


def short_reasons(why: list[str]) -> str:
    """A why-not list as the names of what failed: 'TTFT p99, memory'."""
    names = []
    for w in why:
        w = re.sub(r"^simulated ", "sim ", w)
        m = re.match(r"[A-Za-z][\w /-]*?(?=\s+[\d(]|:|$)", w)
        name = (m.group(0) if m else w)[:20].strip()
        if name not in names:
            names.append(name)
    return "no: " + ", ".join(names)


def _tpot_stats(c: dict) -> dict:
    return c.get("tpot_stats_ms") or {"mean": c["tpot_ms"]}


def _head(r: dict) -> list[str]:
    load = r["load"]
    load_text = (f"{load['requests']} requests at once" if load["kind"] == MAX and load.get("requests") else
                 "max throughput within the limits" if load["kind"] == MAX else
                 f"{load['value']:g} requests/s ({load['arrival']})" if load["kind"] == RATE else
                 f"{load['value']:g} concurrent users")
    lines = [f"{r['model']} on {r['num_devices']} x {r['device']} ({r['engine'] or r['execution']}), {load_text}",
             f"input {r['input_length']} (cached prefix {r['cached_prefix_tokens']}, effective "
             f"{r['effective_input_length']}), output {r['output_length']}, prefill budget {r['max_prefill_tokens']} "
             f"tokens/step; {r['lengths']}"]
    lim = r["limits"]
    parts = [f"{name} {lim['stat']} <= {lim[key]:g} ms" for name, key in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"))
             if lim[key] is not None]
    if parts:
        margin = (f", {lim['headroom']:.0%} headroom kept (aiming at " +
                  ", ".join(f"{lim[k]:g}" for k in ("ttft_target_ms", "tpot_target_ms") if lim[k] is not None)
                  + " ms)") if lim.get("headroom") else ""
        lines.append("limits: " + ", ".join(parts) + margin +
                     ("; objective: goodput" if r.get("objective") == "goodput" else ""))
    return lines


def candidates_table(r: dict, wide: bool = False) -> str:
    stat = r["limits"]["stat"]
    limited = r["limits"]["ttft_ms"] is not None or r["limits"]["tpot_ms"] is not None
    rows = []
    for c in r["candidates"]:
        usd = c.get("dollars")
        per_gpu = f"{c['output_tokens_per_s_per_gpu']:,.0f}"
        row = [layout_text(c), f"{c['batch_size']:.0f}", f"{c['request_rate']:.2f}", spread(c["ttft_ms"], stat),
               spread(_tpot_stats(c), stat), f"{c['output_tokens_per_s']:,.0f}",
               dollars(usd, "usd_per_million_output_tokens") if usd else per_gpu]
        if limited:
            row.append(f"{c['goodput_requests_per_s']:.2f}")
        if wide:
            row = [c["mode"]] + row + [f"{c['total_tokens_per_s']:,.0f}", f"{c['tokens_per_s_per_user']:.1f}",
                                       c["limited_by"]]
            if usd:
                row[8:8] = [per_gpu, f"{usd['usd_per_hour']:,.2f}", dollars(usd, "usd_per_million_total_tokens")]
        row.append("yes" if c["meets_limits"] else "; ".join(c["why_not"]) if wide else short_reasons(c["why_not"]))
        rows.append(row)
    what = "mean|p50/p90/p99" if stat == "mean" else "p50/p90/p99"
    priced = any(c.get("dollars") for c in r["candidates"])
    header = ["layout", "batch/replica", "req/s", "TTFT ms", "TPOT ms", "tok/s", "$/M out" if priced else "tok/s/GPU"]
    if limited:
        header.append("goodput/s")
    if wide:
        header = ["mode"] + header + ["total tok/s", "tok/s/user", "limited by"]
        if priced:
            header[8:8] = ["tok/s/GPU", "$/hour", "$/M total"]
    header.append("meets limits")
    legend = "; ".join([f"TTFT and TPOT over requests: {what}, ms", "batch: requests running per replica"]) + \
        "\n" + "; ".join(["tok/s: output tokens/s"] + (["$/M out: dollars per million output tokens"] if priced else [])
                         + (["goodput: requests/s within every limit"] if limited else []))
    return legend + "\n" + format_table(header, rows)


def verified_table(r: dict, wide: bool = False) -> str:
    stat = r["limits"]["stat"]
    rows = []
    for c in r["candidates"]:
        v = c.get("verified")
        if not v:
            continue
        tpot = v.get("tpot_q_ms") or {"mean": v["tpot_ms"]}
        rows.append([layout_text(c), f"{v['requests']:,}", spread(v["ttft_ms"], stat), spread(tpot, stat),
                     f"{v['output_tokens_per_s']:,.0f}", f"{v['goodput_requests_per_s']:.2f}",
                     "yes" if v["meets_limits"] else "; ".join(v["why_not"]) if wide else short_reasons(v["why_not"])])
    if not rows:
        return ""
    return format_table(["layout", "requests", "TTFT ms", "TPOT ms", "tok/s", "goodput/s", "meets limits"], rows,
                        title="simulated (--verify: the event simulator at the same setup and load)")


def best_text(r: dict) -> str:
    if not r["best"]:
        return f"no feasible layout: {r['why_no_feasible_layout']}"
    b, stat = r["best"], r["limits"]["stat"]
    tpot = _tpot_stats(b)
    text = (f"best: {b['mode']} {layout_text(b)}: {b['output_tokens_per_s']:,.0f} output tokens/s "
            f"({b['output_tokens_per_s_per_gpu']:,.0f} per GPU) at {b['request_rate']:.2f} requests/s, "
            f"{b['batch_size']:.0f} running per replica\n"
            f"      TTFT {stat} {ms(b['ttft_ms'][stat])} ms, TPOT {stat} {ms(tpot.get(stat, b['tpot_ms']))} ms")
    if b.get("tpot_stats_ms"):
        text += (f"; TTFT p50/p90/p99 {spread(b['ttft_ms'], 'p50')} ms, TPOT p50/p90/p99 {spread(tpot, 'p50')} ms")
    if b.get("queue_ms", 0) >= 0.05:
        text += f", {b['queue_ms']:.1f} ms mean wait for a slot"
    usd = b.get("dollars")
    if usd:
        text += (f"\n      ${usd['usd_per_hour']:,.2f}/hour: {dollars(usd, 'usd_per_million_output_tokens')} per million "
                 f"output tokens, {dollars(usd, 'usd_per_million_total_tokens')} per million total")
    return text


def dollars(usd: dict, key: str) -> str:
    v = usd.get(key)
    return "-" if v is None else f"${v:,.3f}" if v < 1 else f"${v:,.2f}"


def speculation_text(spec: dict) -> str:
    """Each speculative setup's best output tokens/s within the limits beside none: speculation can lose."""
    parts = [f"{s['setup']} ({s['tokens_per_step']:.2f} tokens/step): "
             + (f"{s['best_output_tokens_per_s']:,.0f}" if s["best_output_tokens_per_s"] else "none within limits")
             for s in spec["setups"]]
    base = spec["without_output_tokens_per_s"]
    return ("speculation, best output tokens/s within the limits: without " + (f"{base:,.0f}" if base else "none")
            + "; " + "; ".join(parts) + (f"; winner: {spec['winner']}" if spec["winner"] else ""))


def speculation_sources(spec: dict | None, notes: list[str]) -> list[str]:
    """Where each searched method's acceptance comes from, once per method, unless a note already says it (the
    best candidate's): methods compared side by side rest on acceptances of different origins."""
    out, seen = [], set()
    for s in (spec or {}).get("setups", []):
        if s["method"] in seen or any(s["source"] in n for n in notes):
            continue
        seen.add(s["method"])
        rates = ", ".join(f"{a:g}" for a in s["acceptance"])
        out.append(f"speculative decoding, {s['method']}: acceptance {rates} per "
                   f"{'depth' if s['tree'] else 'position'} ({s['source']})")
    return out


def render(r: dict, wide: bool = False, origin_lines=()) -> str:
    """`origin_lines`: where the kernel and overhead numbers come from (cli/common.py origin_notes)."""
    first = [r["origin"]["headline"]] if r.get("origin", {}).get("headline") else []
    parts = first + _head(r) + ["", candidates_table(r, wide)]
    sim = verified_table(r, wide)
    if sim:
        parts += ["", sim]
    parts += ["", best_text(r)]
    if r.get("speculation"):
        parts.append(speculation_text(r["speculation"]))
    notes = sorted({n for c in r["candidates"][:1] for n in c["notes"] if not n.startswith("lengths: ") or
                    "priced" in n})
    notes = [n for n in origin_lines if n not in notes] + notes
    notes += speculation_sources(r.get("speculation"), notes)
    notes += [f"refused {k}: {v}" for k, v in r["refused_layouts"].items()] + [r["price_note"]]
    admission = r.get("kv_admission") and kv_admission_note(r["engine"], r["kv_admission"])
    if admission:
        notes.append(admission)
    parts += [f"warning: {w}" for w in r["warnings"] if w.startswith("overload")]
    return "\n".join(parts + [f"note: {n}" for n in notes])
