"""Simulate a server with block-level prefix caching under a multi-user workload.

    python -m cli.inference.serving_sim MODEL --device DEVICE --workload PRESET|FILE.jsonl
        [--num-requests R] [--request-rate QPS] [--seed S] [--block-size 16] [--gpu-cache-gb auto|X]
        [--cpu-cache-gb Y] [--max-prefill-tokens T] [--compare] [--json]
"""
from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from cost.profile import load_profile
from serving.simulator import ServerConfig, StepCost, simulate
from serving.workload import PRESETS, PresetSizes, WorkloadError, load_jsonl, preset
from tracer.model_source import resolve_model
from tracer.table import format_table
from tracer.trace import trace
from tracer.work import Request

from ..common import ArgumentParser, add_device_arguments, add_model_arguments, positive_int, run_main, trace_options
from .memory import kv_heads, peak_activation_bytes

MEMORY_UTILIZATION = 0.9


def server_config(args, spec, hw, options) -> ServerConfig:
    probe = trace(spec, Request(1, args.max_prefill_tokens, 0), options)
    block_bytes = args.block_size * probe.kv_bytes_per_token / max(1, min(args.tp_size, kv_heads(probe)))
    if args.gpu_cache_gb == "auto":
        free = (hw.memory_capacity_gb * 1e9 * MEMORY_UTILIZATION - probe.weight_bytes / args.tp_size
                - peak_activation_bytes(probe, args.tp_size))
        if free <= 0:
            raise ValueError(f"{spec.name} does not fit on {hw.name} with TP={args.tp_size}: no room for a KV cache")
        gpu_gb = free / 1e9
    else:
        gpu_gb = float(args.gpu_cache_gb)
        if gpu_gb <= 0:
            raise ValueError("--gpu-cache-gb must be > 0 or auto")
    return ServerConfig(block_size=args.block_size, gpu_blocks=int(gpu_gb * 1e9 // block_bytes),
                        cpu_blocks=int(args.cpu_cache_gb * 1e9 // block_bytes),
                        max_prefill_tokens=args.max_prefill_tokens, max_running=args.max_running,
                        block_bytes=block_bytes, host_link_bytes_per_s=hw.host_link_bandwidth_gbps * 1e9)


def load_workload(args):
    if args.workload in PRESETS:
        sizes = PresetSizes(system_tokens=args.system_tokens, user_tokens=args.user_tokens,
                            output_tokens=args.output_tokens, turns=args.turns, documents=args.documents,
                            document_tokens=args.document_tokens, question_tokens=args.question_tokens)
        return preset(args.workload, args.num_requests, args.request_rate, args.seed, sizes)
    if Path(args.workload).suffix in (".jsonl", ".json") or Path(args.workload).exists():
        return load_jsonl(args.workload)
    raise WorkloadError(f"unknown workload '{args.workload}' (presets: {', '.join(PRESETS)}; or a .jsonl file)")


def run(args) -> dict:
    spec, hw, options = resolve_model(args.model), load_profile(args.device), trace_options(args)
    requests = load_workload(args)
    config = server_config(args, spec, hw, options)
    cost = StepCost(spec, hw, options, args.execution, args.tp_size, args.engine)
    runs = {"gpu" if not args.cpu_cache_gb else "gpu+cpu": config}
    if args.compare:
        cpu_blocks = config.cpu_blocks or int(64e9 // config.block_bytes)
        runs = {"no-cache": replace(config, prefix_caching=False, cpu_blocks=0),
                "gpu": replace(config, cpu_blocks=0), "gpu+cpu": replace(config, cpu_blocks=cpu_blocks)}
    results = {}
    for label, cfg in runs.items():
        if sys.stderr.isatty():
            print(f"simulating {label} ({len(requests)} requests)...", file=sys.stderr)
        for r in requests:
            r.block_hashes = []
        results[label] = simulate(requests, cost, cfg).summary(cfg)
    return {"model": spec.name, "device": hw.name, "tp_size": args.tp_size, "workload": args.workload,
            "num_requests": len(requests), "block_size": config.block_size,
            "block_bytes": config.block_bytes, "runs": results}


def render(out: dict) -> str:
    runs = out["runs"]

    def f(v, fmt="{:.1f}"):
        return "-" if v is None else fmt.format(v)
    rows = [
        ["token hit rate", *(f"{r['hit_rate'] * 100:.1f}%" for r in runs.values())],
        ["block hit rate", *(f"{r['block_hit_rate'] * 100:.1f}%" for r in runs.values())],
        ["reused tokens", *(f"{r['reused_tokens']:,}" for r in runs.values())],
        ["TTFT p50 / p90 / p99 ms", *(f"{f(r['ttft_ms']['p50'])} / {f(r['ttft_ms']['p90'])} / {f(r['ttft_ms']['p99'])}"
                                      for r in runs.values())],
        ["TPOT p50 / p99 ms", *(f"{f(r['tpot_ms']['p50'], '{:.2f}')} / {f(r['tpot_ms']['p99'], '{:.2f}')}"
                                for r in runs.values())],
        ["prefill tokens/s", *(f"{r['prefill_tokens_per_s']:,.0f}" for r in runs.values())],
        ["output tokens/s", *(f"{r['output_tokens_per_s']:,.0f}" for r in runs.values())],
        ["GPU KV GB peak / mean / cap", *(f"{r['kv_memory_gb']['gpu_peak']:.1f} / {r['kv_memory_gb']['gpu_mean']:.1f} / "
                                          f"{r['kv_memory_gb']['gpu_capacity']:.1f}" for r in runs.values())],
        ["CPU KV GB peak / mean", *(f"{r['kv_memory_gb']['cpu_peak']:.1f} / {r['kv_memory_gb']['cpu_mean']:.1f}"
                                    for r in runs.values())],
        ["eviction rate", *(f"{r['eviction_rate'] * 100:.1f}%" for r in runs.values())],
        ["CPU-tier hit blocks", *(f"{r['cpu_tier']['hit_blocks']:,}" for r in runs.values())],
        ["CPU transfer / compute saved ms", *(f"{r['cpu_tier']['transfer_ms']:.1f} / "
                                              f"{r['cpu_tier']['saved_compute_ms']:.1f}" for r in runs.values())],
        ["completed / rejected", *(f"{r['completed_requests']} / {r['rejected_requests']}" for r in runs.values())],
    ]
    title = (f"{out['model']} on {out['device']} (TP={out['tp_size']}), workload {out['workload']}, "
             f"{out['num_requests']} requests, block size {out['block_size']}")
    return format_table(["metric", *runs.keys()], rows, title=title)


def body(args) -> int:
    out = run(args)
    print(json.dumps(out, indent=1) if args.json else render(out))
    return 0


def main(argv=None) -> int:
    p = ArgumentParser(prog="serving-sim", description=__doc__.split("\n")[0])
    p.add_argument("model")
    add_device_arguments(p)
    p.add_argument("--tp-size", type=positive_int, default=1)
    p.add_argument("--workload", required=True, help=f"a preset ({', '.join(PRESETS)}) or a JSONL trace file")
    p.add_argument("--num-requests", type=positive_int, default=200)
    p.add_argument("--request-rate", type=float, default=None, help="Poisson arrivals per second (default: all at 0)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block-size", type=positive_int, default=16)
    p.add_argument("--gpu-cache-gb", default="auto", help="KV cache size on the GPU, or auto (memory left after "
                                                          "weights and activations, at 90%% utilization)")
    p.add_argument("--cpu-cache-gb", type=float, default=0.0, help="CPU (global) prefix pool size (default 0: none)")
    p.add_argument("--max-prefill-tokens", type=positive_int, default=8192)
    p.add_argument("--max-running", type=positive_int, default=256, help="concurrent requests (default 256)")
    p.add_argument("--compare", action="store_true", help="no prefix cache vs GPU cache vs GPU + CPU tier")
    p.add_argument("--json", action="store_true")
    sizes = p.add_argument_group("preset sizes")
    sizes.add_argument("--system-tokens", type=positive_int, default=2048)
    sizes.add_argument("--user-tokens", type=positive_int, default=64)
    sizes.add_argument("--output-tokens", type=positive_int, default=128)
    sizes.add_argument("--turns", type=positive_int, default=4)
    sizes.add_argument("--documents", type=positive_int, default=4)
    sizes.add_argument("--document-tokens", type=positive_int, default=8192)
    sizes.add_argument("--question-tokens", type=positive_int, default=32)
    add_model_arguments(p)
    args = p.parse_args(argv)
    if args.request_rate is not None and not args.request_rate > 0:
        p.error("--request-rate must be > 0")
    if args.cpu_cache_gb < 0:
        p.error("--cpu-cache-gb must be >= 0")
    return run_main(body, args)


if __name__ == "__main__":
    sys.exit(main())
