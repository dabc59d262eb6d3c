"""serving_sim --disagg P:D: the workload through P prefill instances and D decode instances of --tp-size GPUs
each (serving/disagg_sim.py): each pool its own queue, the KV of every prompt sent over the prefill instance's
link to the decode pool. One table of what a user and an operator read."""
from __future__ import annotations

from dataclasses import replace

from serving import overload
from serving.disagg_sim import DisaggConfig, simulate_disagg
from serving.metrics import latency_ms
from serving.simulator import ServerConfig
from serving.step_cost import StepCost
from tracer.table import format_table
from tracer.trace import trace
from tracer.work import Request

from .config import InputError


def parse_pools(text: str) -> tuple[int, int]:
    """'P:D' -> (prefill instances, decode instances)."""
    try:
        p, d = (int(x) for x in text.split(":"))
    except ValueError:
        raise InputError(f"--disagg takes PREFILL:DECODE instance counts, e.g. 2:6; got '{text}'") from None
    if not (1 <= p <= 4096 and 1 <= d <= 4096):
        raise InputError(f"--disagg counts must be in [1, 4096], got '{text}'")
    return p, d


def check_flags(args) -> None:
    for given, flag in ((args.compare, "--compare"), (args.sweep_gpu_cache_gb, "--sweep-gpu-cache-gb"),
                        (args.cpu_cache_gb, "--cpu-cache-gb"), (args.concurrency, "--concurrency"),
                        (args.instances != 1, "--instances")):
        if given:
            raise InputError(f"--disagg simulates one open-loop setup of its own pools: {flag} does not combine "
                             f"with it")


def run(args, spec, hw, options, requests, config: ServerConfig, cost: StepCost, price) -> dict:
    prefill_n, decode_n = parse_pools(args.disagg)
    kv_per_token = trace(spec, Request(1, 1, 1, decode=True), options).kv_bytes_per_token
    kv_tokens = config.gpu_blocks * config.block_size      # each decode instance holds what a mixed one would
    pools = DisaggConfig(replace(config, instances=prefill_n), decode_n, config.max_running, kv_tokens, kv_per_token,
                         hw.interconnect_bandwidth_gbps * 1e9)
    result = simulate_disagg(requests, cost, cost, pools)
    recs = result.records
    tpots = [r.tpot_s for r in recs if r.tpot_s is not None]
    admitted = [_Admitted(r) for r in recs]
    gpus = (prefill_n + decode_n) * args.tp_size
    span = max(1e-12, result.makespan_s)
    output = sum(r.output_tokens for r in recs) / span
    total = sum(r.output_tokens + r.prompt_tokens for r in recs) / span
    summary = {"completed_requests": len(recs), "rejected_requests": len(result.rejected_ids),
               "ttft_ms": latency_ms([r.ttft_s for r in recs]), "tpot_ms": latency_ms(tpots),
               "e2e_ms": latency_ms([r.finish_s - r.arrival_s + r.outside_s for r in recs]),
               "kv_transfer_wait_ms": latency_ms([r.transfer_wait_s for r in recs]),
               "decode_slot_wait_ms": latency_ms([r.decode_admit_s - r.first_token_s for r in recs]),
               "output_tokens_per_s": output, "total_tokens_per_s": total, "output_tokens_per_s_per_gpu": output / gpus,
               "request_rate": len(recs) / span, "makespan_s": result.makespan_s,
               "prefill_steps": result.prefill_steps, "decode_steps": result.decode_steps,
               "decode_batch_mean": result.decode_running_s / span / decode_n,
               "overload": overload.simulated(admitted, requests),
               "dollars": price.of(gpus, output, total) if price else None}
    label = f"P{prefill_n}xTP{args.tp_size} D{decode_n}xTP{args.tp_size}"
    return {"label": label, "prefill_instances": prefill_n, "decode_instances": decode_n, "gpus": gpus,
            "kv_bytes_per_token": kv_per_token, "link": hw.interconnect_name,
            "link_gb_per_s": hw.interconnect_bandwidth_gbps, "decode_kv_tokens": kv_tokens, "run": summary}


class _Admitted:
    """A request as the overload checks read it: it waited until its first token (prefill queue and link)."""
    __slots__ = ("arrival_s", "admit_s", "finish_s")

    def __init__(self, r):
        self.arrival_s, self.admit_s, self.finish_s = r.arrival_s, r.first_token_s, r.finish_s


def _pcts(d: dict, fmt: str = "{:.1f}") -> str:
    if not d["requests"]:
        return "-"
    return " / ".join(fmt.format(d[k]) for k in ("p50", "p90", "p99"))


def render(d: dict) -> str:
    r = d["run"]
    rows = [["TTFT p50 / p90 / p99 ms", _pcts(r["ttft_ms"])],
            ["TPOT p50 / p90 / p99 ms", _pcts(r["tpot_ms"], "{:.2f}")],
            ["E2E latency p50 / p90 / p99 ms", _pcts(r["e2e_ms"])],
            ["KV transfer wait p50 / p90 / p99 ms", _pcts(r["kv_transfer_wait_ms"], "{:.2f}")],
            ["decode slot wait p50 / p90 / p99 ms", _pcts(r["decode_slot_wait_ms"], "{:.2f}")],
            ["output tokens/s (per GPU)", f"{r['output_tokens_per_s']:,.0f} ({r['output_tokens_per_s_per_gpu']:,.0f})"],
            ["total tokens/s", f"{r['total_tokens_per_s']:,.0f}"],
            ["requests/s", f"{r['request_rate']:.2f}"],
            ["decode batch per instance, mean", f"{r['decode_batch_mean']:.1f}"],
            ["completed / rejected", f"{r['completed_requests']} / {r['rejected_requests']}"],
            ["overloaded (see warnings)", "YES" if r["overload"] else "no"]]
    if r["dollars"]:
        u = r["dollars"]
        rows.append(["$/hour; $/M output / total tokens", f"{u['usd_per_hour']:,.2f}; " + " / ".join(
            "-" if u[k] is None else f"{u[k]:,.3f}" for k in ("usd_per_million_output_tokens",
                                                              "usd_per_million_total_tokens"))])
    title = (f"disaggregated {d['label']} ({d['gpus']} GPUs): KV {d['kv_bytes_per_token'] / 1e3:.1f} kB per token "
             f"over {d['link']} at {d['link_gb_per_s']:g} GB/s, one transfer at a time per prefill instance")
    return format_table(["metric", d["label"]], rows, title=title)
