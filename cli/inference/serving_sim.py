"""Simulate a server's prefix cache under a multi-user workload, with an engine's cache rules.

    python -m cli.inference.serving_sim MODEL --device DEVICE --workload PRESET|FILE.jsonl|mooncake:FILE
        | --lengths-file FILE
        [--num-requests R] [--request-rate QPS] [--time-scale X] [--seed S] [--block-size 16]
        [--cache-policy vllm|sglang] [--gpu-cache-gb auto|X | --kv-cache-tokens N] [--sweep-gpu-cache-gb 8,16,32,64]
        [--cpu-cache-gb Y] [--instances N] [--routing round-robin|cache-aware]
        [--max-prefill-tokens T] [--max-running N] [--compare] [--disagg P:D] [--gpu-hour-price USD]
        [--hit-window-s S] [--plot FILE.png] [--json]
"""
from __future__ import annotations

import os
import random
from argparse import ArgumentTypeError
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from multiprocessing import get_context
from pathlib import Path

from cost.engines import ENGINES, nearest_release, serving_overheads
from cost.op_formats import expert_resident
from serving.capacity import kv_admission, replica_memory, reserves_whole_output
from serving.arrivals import ClosedLoopArrivals
from serving.kv_cache import CACHE_POLICIES
from serving.routing import ROUTERS
from serving import overload
from . import disagg_run
from .config import InputError
from serving.dollars import NO_PRICE, gpu_price
from serving.simulator import ServerConfig, StepCost, simulate
from serving.speculative import speculative_step
from serving.lengths import bundled_sets, read_lengths
from serving.traces import MAX_ARRIVAL_S, load_jsonl, load_mooncake
from serving.verify import fixed_requests
from serving.workload import ARRIVALS, PRESETS, PresetSizes, WorkloadError, arrival_times, hash_requests, preset
from tracer.trace import trace
from tracer.work import Request

from ..common import (MAX_BATCH_TOKENS, MAX_REQUESTS, MAX_RUNNING, MAX_SIM_STEPS, MAX_SIM_TOKENS, ArgumentParser,
                      add_capacity_scheduler_argument, add_endpoint_argument, add_speculation_arguments,
                      add_streaming_argument,
                      check_capacity_scheduler, speculations,
                      Layout, add_device_arguments, add_model_arguments, check_layout_or_fail, check_plot_path,
                      dumps_strict, finite_float, load_device, model_spec, positive_int,
                      quiet_broken_pipe, run_main, trace_options, warn)
from ..progress import Progress
from .memory import kv_heads
from .serving_sim_report import render, write_plot

MAX_CACHE_GB = 1e6   # a petabyte of KV cache per instance: beyond any machine


def server_config(args, spec, hw, options) -> ServerConfig:
    probe = trace(spec, Request(1, args.max_prefill_tokens, 0), options)
    if probe.kv_bytes_per_token <= 0:  # a pure SSM / linear-attention model: constant state, no KV blocks
        raise ValueError(f"{spec.name} has no attention KV cache (only recurrent state), so there is no prefix "
                         f"cache to simulate")
    block_bytes = args.block_size * probe.kv_bytes_per_token / max(1, min(args.tp_size, kv_heads(probe)))
    if args.kv_cache_tokens is not None:     # what the engine logged: its blocks, the null block among them
        gpu_blocks = args.kv_cache_tokens // args.block_size
        if gpu_blocks < 2:
            raise ValueError(f"--kv-cache-tokens {args.kv_cache_tokens} holds {gpu_blocks} block(s) of "
                             f"{args.block_size} tokens: too small")
        if gpu_blocks * block_bytes / 1e9 > MAX_CACHE_GB:
            raise ValueError(f"--kv-cache-tokens {args.kv_cache_tokens:,} is {gpu_blocks * block_bytes / 1e9:,.0f} GB "
                             f"of KV cache, beyond {MAX_CACHE_GB:g} GB per instance")
    elif args.gpu_cache_gb == "auto":
        gpu_blocks = _blocks(estimated_cache_gb(args, probe, hw, spec), block_bytes)
    else:
        gpu_blocks = _blocks(_positive_gb(args.gpu_cache_gb, "--gpu-cache-gb"), block_bytes)
    return ServerConfig(block_size=args.block_size, gpu_blocks=gpu_blocks,
                        cpu_blocks=int(args.cpu_cache_gb * 1e9 // block_bytes), gpus_per_instance=args.tp_size,
                        max_prefill_tokens=args.max_prefill_tokens, max_running=args.max_running,
                        block_bytes=block_bytes, host_link_bytes_per_s=hw.host_link_bandwidth_gbps * 1e9,
                        cache_policy=args.cache_policy, instances=args.instances, routing=args.routing,
                        api_server=args.api_server, chat_requests=args.endpoint == "chat",
                        reserve_output=args.execution == "engine" and reserves_whole_output(args.engine,
                                                                                             args.capacity_scheduler))


def estimated_cache_gb(args, probe, hw, spec) -> float:
    """What the engine's memory budget leaves for the KV cache per GPU (serving/capacity.py), as the optimizer
    uses it."""
    defaults = ENGINES[args.engine].serving_defaults(hw.memory_capacity_gb, hw.name)
    overheads = serving_overheads(args.engine, nearest_release(args.engine, args.engine_release))[0]
    reserve, group = (overheads.reserve_gb, overheads.group_reserve_gb) if args.execution == "engine" else (0, 0)
    free = replica_memory(probe, hw, defaults, reserve, tp=args.tp_size, group_reserve_gb=group,
                          expert_resident=expert_resident(probe, args.engine, hw, args.execution)).kv_cache
    if free <= 0:
        raise ValueError(f"{spec.name} does not fit on {hw.name} with TP={args.tp_size}: no room for a KV cache")
    return free / 1e9


def _positive_gb(text: str, flag: str) -> float:
    try:
        gb = float(text)
    except ValueError:
        raise ValueError(f"{flag} must be a number of GB or auto, got '{text}'") from None
    if not 0 < gb <= MAX_CACHE_GB:
        raise ValueError(f"{flag} must be in (0, {MAX_CACHE_GB:g}], got {text}")
    return gb


def _blocks(gb: float, block_bytes: float) -> int:
    blocks = int(gb * 1e9 // block_bytes)
    if blocks < 2:
        raise ValueError(f"a {gb:g} GB KV cache holds {blocks} block(s) of {block_bytes / 1e6:.2f} MB: too small")
    return blocks


def length_requests(args, lengths):
    """Fresh prompts (nothing shared) with each request's lengths from the distribution: all of a file's
    requests, or --num-requests drawn from it."""
    n = args.num_requests or lengths.requests
    MAX_REQUESTS.check(n, "--num-requests")
    times = arrival_times(n, args.request_rate, random.Random(args.seed), args.arrival)
    return fixed_requests(n, 0, 0, 0, times, lengths, args.seed)


def load_workload(args):
    if args.lengths_file is not None:
        if args.workload not in (None, "random"):
            raise WorkloadError(f"--lengths-file gives fresh prompts of the file's lengths; it does not combine "
                                f"with --workload {args.workload}")
        args.lengths = read_lengths(args.lengths_file)
        args.workload = "random"
        requests = length_requests(args, args.lengths)
        MAX_REQUESTS.check(len(requests), "requests")
        return requests
    args.lengths = None
    if args.workload is None:
        raise WorkloadError("give --workload PRESET|FILE.jsonl|mooncake:FILE, or --lengths-file FILE")
    if args.workload not in PRESETS:
        # a trace is replayed whole at its own arrival times (--time-scale speeds it up)
        given = [flag for flag, value in (("--num-requests", args.num_requests), ("--request-rate", args.request_rate))
                 if value is not None]
        if given:
            verb = "apply" if len(given) > 1 else "applies"
            raise WorkloadError(f"{' and '.join(given)} {verb} to a preset or --lengths-file; the trace "
                                f"{args.workload} is replayed whole at its own arrival times (scale them with "
                                f"--time-scale)")
    args.num_requests = args.num_requests or 200
    if args.workload in PRESETS:
        MAX_REQUESTS.check(args.num_requests, "--num-requests")
        sizes = PresetSizes(system_tokens=args.system_tokens, user_tokens=args.user_tokens,
                            output_tokens=args.output_tokens, turns=args.turns, documents=args.documents,
                            document_tokens=args.document_tokens, question_tokens=args.question_tokens,
                            input_tokens=args.input_tokens)
        requests = preset(args.workload, args.num_requests, args.request_rate, args.seed, sizes, args.arrival)
    elif args.workload.startswith("mooncake:"):
        requests = load_mooncake(args.workload[len("mooncake:"):], args.mooncake_block_tokens)
    elif Path(args.workload).suffix in (".jsonl", ".json") or Path(args.workload).exists():
        requests = load_jsonl(args.workload)
    else:
        raise WorkloadError(f"unknown workload '{args.workload}' (presets: {', '.join(PRESETS)}; a .jsonl file; "
                            f"or mooncake:FILE)")
    if args.time_scale != 1.0:
        for r in requests:
            r.arrival_s *= args.time_scale
    MAX_REQUESTS.check(len(requests), f"{args.workload}: requests")
    last = max(r.arrival_s for r in requests)
    if not last <= MAX_ARRIVAL_S:   # also NaN
        raise WorkloadError(f"{args.workload}: arrivals reach {last:.3g} s, beyond {MAX_ARRIVAL_S:.0e} s (about 116 "
                            f"days), where step times vanish in the clock's precision (lower --time-scale or raise "
                            f"--request-rate)")
    return requests


def check_work(args, requests) -> None:
    """Refuse a simulation whose estimated size is beyond the limits, before any step is simulated."""
    prompt = sum(r.prompt_tokens for r in requests)
    output = sum(r.output_tokens for r in requests)
    MAX_SIM_TOKENS.check(prompt + output, "the workload's tokens (prompt + output)")
    # lower bound of the engine steps: every prompt token within the step budget, decode tokens per step at
    # most min(budget, running requests); prefix hits shorten prefill, so this may overestimate prefill
    decode_width = max(1, min(args.max_prefill_tokens, args.max_running, len(requests)))
    steps = prompt / args.max_prefill_tokens + output / decode_width
    MAX_SIM_STEPS.check(steps, f"the estimated engine steps (--max-prefill-tokens {args.max_prefill_tokens})")


def _runs(args, config: ServerConfig) -> dict[str, ServerConfig]:
    if args.sweep_gpu_cache_gb:
        return {f"{gb:g} GB": replace(config, gpu_blocks=_blocks(gb, config.block_bytes))
                for gb in args.sweep_gpu_cache_gb}
    if args.compare:
        cpu_blocks = config.cpu_blocks or int(64e9 // config.block_bytes)
        return {"no-cache": replace(config, prefix_caching=False, cpu_blocks=0),
                "gpu": replace(config, cpu_blocks=0), "gpu+cpu": replace(config, cpu_blocks=cpu_blocks)}
    return {"gpu" if not config.cpu_blocks else "gpu+cpu": config}


_SHARED: dict = {}   # what forked sweep workers read instead of pickling the workload


def _simulate_one(label: str) -> tuple[str, dict]:
    requests, cost, runs, window_s, users = _SHARED["job"]
    cfg = runs[label]
    arrivals = ClosedLoopArrivals(requests, users) if users else None
    with Progress(len(requests), f"simulating {label}", unit="req", position=list(runs).index(label)) as bar:
        result = simulate(requests, cost, cfg, arrivals, on_progress=bar.set)
    summary = result.summary(cfg, window_s)
    where = f" ({label})" if len(runs) > 1 else ""
    summary["overload"] = overload.simulated(result.records, requests, users,
                                             cfg.max_running * cfg.instances if users else None, where)
    return label, summary


def run(args) -> dict:
    spec, hw, options = model_spec(args), load_device(args), trace_options(args)
    defaults = ENGINES[args.engine].serving_defaults(hw.memory_capacity_gb, hw.name)
    running_given = args.max_running is not None
    args.max_running = args.max_running or defaults.max_num_seqs
    args.max_prefill_tokens = args.max_prefill_tokens or defaults.max_batched_tokens
    MAX_RUNNING.check(args.max_running, "--max-running")
    check_capacity_scheduler(args)
    MAX_BATCH_TOKENS.check(args.max_prefill_tokens, "--max-prefill-tokens")
    check_plot_path(args.plot)
    requests = load_workload(args)
    check_work(args, requests)
    report = check_layout_or_fail(spec.config, spec.name, Layout(tp=args.tp_size),
                                  max(r.prompt_tokens + r.output_tokens for r in requests), args.moe_imbalance)
    config = server_config(args, spec, hw, options)
    drafts = speculations(args)
    if len(drafts) > 1:
        raise InputError("serving_sim simulates one speculative setup, one --speculative method and one "
                         "--num-speculative-tokens (the optimizer searches several)")
    if drafts and args.disagg:
        raise InputError("--speculative is not simulated with --disagg")
    cost = speculative_step(StepCost(spec, hw, options, args.execution, args.tp_size, args.engine,
                                     release=args.engine_release, streams=args.stream), drafts[0] if drafts else None)
    if drafts and args.kv_cache_tokens is None:   # the draft's weights and KV take their share of the cache
        plain = cost.target.replica_memory(config.max_prefill_tokens)
        ours = cost.replica_memory(config.max_prefill_tokens, max_num_seqs=args.max_running)
        config = replace(config, gpu_blocks=max(1, int(config.gpu_blocks * ours.kv_tokens / max(1, plain.kv_tokens))))
        if not running_given:   # an engine's own cap when it speculates (SGLang: 48), as the optimizer applies it
            config = replace(config, max_running=min(config.max_running, cost.defaults.max_num_seqs))
    if args.disagg:
        price = gpu_price(hw, args.gpu_hour_price)
        d = disagg_run.run(args, spec, hw, options, requests, config, cost, price)
        return {"model": spec.name, "device": hw.name, "tp_size": args.tp_size, "workload": args.workload,
                "num_requests": len(requests), "engine": args.engine, "streams": args.stream, "endpoint": args.endpoint,
                "step_overheads": cost.overhead_origin,
                "load": _load_label(args), "disaggregated": d, "price_note": price.note if price else NO_PRICE,
                "warnings": list(report.warnings) + d["run"]["overload"],
                "lengths": args.lengths.describe() if args.lengths else None}
    runs = _runs(args, config)
    hash_requests(requests, config.block_size)   # identities once, shared by every run (and by forked workers)
    _SHARED["job"] = (requests, cost, runs, args.hit_window_s, args.concurrency)
    price = gpu_price(hw, args.gpu_hour_price)
    workers = min(len(runs), os.cpu_count() or 1, args.jobs)
    if workers > 1:
        context = get_context("fork")
        with context.Manager() as manager, ProcessPoolExecutor(workers, mp_context=context) as pool:
            cost.shared = manager.dict()   # the workers trace each step shape once between them
            results = dict(pool.map(_simulate_one, runs))
        cost.shared = None
    else:
        results = dict(map(_simulate_one, runs))
    logged_cache = [f"KV cache: {args.kv_cache_tokens:,} tokens per instance as the engine logged them "
                    f"(--kv-cache-tokens), {config.gpu_blocks:,} blocks of {config.block_size}"] \
        if args.kv_cache_tokens else []
    for label, summary in results.items():
        summary["dollars"] = price.of(runs[label].gpus, summary["output_tokens_per_s"],
                                      summary["total_tokens_per_s"]) if price else None
    out = {"model": spec.name, "device": hw.name, "tp_size": args.tp_size, "workload": args.workload,
           "price_note": price.note if price else NO_PRICE,
           "num_requests": len(requests), "block_size": config.block_size, "block_bytes": config.block_bytes,
           "cache_policy": config.cache_policy, "instances": config.instances, "routing": config.routing,
           "time_scale": args.time_scale, "engine": args.engine, "streams": args.stream, "endpoint": args.endpoint,
           "kv_admission": kv_admission(args.engine, args.capacity_scheduler) if args.execution == "engine" else None,
           "scheduling": PREFILL_APART_NOTE if args.execution == "engine" and cost.defaults.prefill_apart else None,
           "step_overheads": cost.overhead_origin,
           "origin": cost.origin.as_json(),
           # how the steps are priced: weight formats, collectives, the draft (the speculation line is its own)
           "pricing_notes": [n for n in cost.formats_notes()
                             if cost.speculation is None or n != cost.speculation.describe()] + logged_cache,
           "speculation": cost.speculation.describe() if cost.speculation is not None else None,
           "load": _load_label(args), "runs": {k: results[k] for k in runs},
           "warnings": list(report.warnings) + [m for k in runs for m in results[k]["overload"]],
           "lengths": args.lengths.describe() if args.lengths else None,
           "length_distribution": args.lengths.as_json() if args.lengths else None}
    if args.sweep_gpu_cache_gb:
        out["sweep"] = [{"gpu_cache_gb": gb, "hit_rate": r["hit_rate"], "ttft_ms_p50": r["ttft_ms"]["p50"],
                         "evicted_blocks": r["evictions"]["blocks"], "preemptions": r["preemptions"]["count"]}
                        for gb, r in zip(args.sweep_gpu_cache_gb, out["runs"].values())]
    return out


def _load_label(args) -> str:
    if args.concurrency:
        return f"closed loop, {args.concurrency} users"
    if args.request_rate:
        return f"open loop, {args.arrival} arrivals at {args.request_rate:g} requests/s"
    return "all requests at once" if args.workload in PRESETS else "the trace's arrival times"


# what the simulator's steps leave out of an engine whose prefill steps run apart (cost/engines.py ServingDefaults)
PREFILL_APART_NOTE = ("this engine runs a step with prompts to prefill apart from its decodes, which wait through it "
                      "(SGLang's scheduler); the simulator mixes them in every step, so its TPOT where prompts keep "
                      "arriving is low (throughput_optimizer's walked bursts price it)")

def body(args) -> int:
    out = run(args)
    print(dumps_strict(out, indent=1) if args.json else render(out))
    if args.plot:
        write_plot(out, args.plot)
    return 0


def _gb_list(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--sweep-gpu-cache-gb takes GB values separated by commas, got '{text}'") from None
    if not values or any(not 0 < v <= MAX_CACHE_GB for v in values):
        raise ValueError(f"--sweep-gpu-cache-gb values must be in (0, {MAX_CACHE_GB:g}], got '{text}'")
    if len(values) > 64:
        raise ValueError(f"--sweep-gpu-cache-gb takes at most 64 sizes, got {len(values)}")
    return values


def bounded_int(high: int):
    """argparse type: an integer in [1, high]."""
    def parse(text: str) -> int:
        value = positive_int(text)
        if value > high:
            raise ArgumentTypeError(f"must be <= {high:,}, got {text}")
        return value
    return parse


@quiet_broken_pipe
def main(argv=None) -> int:
    p = ArgumentParser(prog="serving-sim", description=__doc__.split("\n")[0])
    p.add_argument("model", help="bundled model name, folder or config.json path, or HF id in the local cache")
    add_device_arguments(p)
    add_speculation_arguments(p)
    add_streaming_argument(p)
    add_endpoint_argument(p)
    p.add_argument("--no-api-server", dest="api_server", action="store_false", default=True,
                   help="requests reach the engine directly (an offline LLM(...) run), not through its HTTP "
                        "server's one-at-a-time intake (the engine's fitted frontend_ms; docs/engines.md)")
    p.add_argument("--tp-size", type=positive_int, default=1, help="tensor-parallel degree per instance (default 1)")
    p.add_argument("--workload", default=None,
                   help=f"a preset ({', '.join(PRESETS)}), a JSONL trace file, or mooncake:FILE (a Mooncake trace)")
    p.add_argument("--lengths-file", default=None, metavar="FILE",
                   help="fresh prompts with per-request lengths: a CSV (header with input_length, output_length) "
                        "or JSONL file, or a bundled set (" + ", ".join(bundled_sets()) + "); all of its requests, "
                        "or --num-requests drawn from it; sent at once without --request-rate/--concurrency")
    p.add_argument("--num-requests", type=positive_int, default=None,
                   help=f"requests of a preset (default 200) or drawn from --lengths-file (default: all of it); at "
                        f"most {MAX_REQUESTS.default:,}, raised with {MAX_REQUESTS.env}")
    p.add_argument("--request-rate", type=finite_float(0.0, 1e9, low_open=True), default=None,
                   help="open loop: a preset's arrivals per second (default: all at once, maximum throughput)")
    p.add_argument("--arrival", default="poisson", choices=ARRIVALS,
                   help="open-loop arrivals: poisson (default) or constant (evenly spaced)")
    p.add_argument("--concurrency", type=positive_int, default=None,
                   help="closed loop: this many users, each sending its next request when answered")
    p.add_argument("--time-scale", type=finite_float(0.0, 1e6, low_open=True), default=1.0,
                   help="multiply every arrival time by X: 0.5 replays a trace twice as fast (default 1)")
    p.add_argument("--mooncake-block-tokens", type=bounded_int(1 << 20), default=512,
                   help="tokens per Mooncake hash id (512 in the FAST'25 release)")
    p.add_argument("--seed", type=int, default=0, help="seed of a preset's random choices and arrivals (default 0)")
    p.add_argument("--block-size", type=bounded_int(1 << 16), default=16,
                   help="tokens per KV block; prefix hits count in whole blocks (default 16)")
    add_capacity_scheduler_argument(p)
    p.add_argument("--cache-policy", default="vllm", choices=list(CACHE_POLICIES),
                   help="whose prefix-cache rules: vllm (paged blocks, default) or sglang (token radix tree)")
    p.add_argument("--gpu-cache-gb", default="auto", help="KV cache size per GPU instance, or auto (memory left "
                                                          "after weights and activations, at 90%% utilization)")
    p.add_argument("--kv-cache-tokens", type=positive_int, default=None, metavar="N",
                   help="the KV cache per instance in tokens, as your engine logged it (vLLM: 'GPU KV cache size: N "
                        "tokens'), instead of --gpu-cache-gb")
    p.add_argument("--sweep-gpu-cache-gb", type=str, default=None, metavar="GB,GB,...",
                   help="one run per GPU cache size: hit rate vs capacity (table; --plot draws it)")
    p.add_argument("--cpu-cache-gb", type=finite_float(0.0, MAX_CACHE_GB), default=0.0,
                   help="CPU global prefix pool shared by all instances, written through at prefill end (default 0)")
    p.add_argument("--instances", type=bounded_int(4096), default=1, help="data-parallel engine instances (default 1)")
    p.add_argument("--routing", default="round-robin", choices=list(ROUTERS),
                   help="how requests pick an instance (default round-robin)")
    p.add_argument("--max-prefill-tokens", type=positive_int, default=None,
                   help="tokens per step, decode tokens included (max_num_batched_tokens; default: the engine's). "
                        f"A run of more than {MAX_SIM_STEPS.default:,} estimated steps is refused (raise with "
                        f"{MAX_SIM_STEPS.env})")
    p.add_argument("--max-running", type=positive_int, default=None,
                   help="requests running at once (max_num_seqs; default: the engine's)")
    p.add_argument("--compare", action="store_true", help="no prefix cache vs GPU cache vs GPU + CPU tier")
    p.add_argument("--disagg", default=None, metavar="P:D",
                   help="disaggregated serving: P prefill and D decode instances of --tp-size GPUs, each pool with "
                        "its own queue, KV sent over the interconnect")
    p.add_argument("--hit-window-s", type=finite_float(0.0, MAX_ARRIVAL_S, low_open=True), default=None,
                   help="window of the hit rate over time (default: the run's span / 40)")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="draw hit rate and TTFT over time (with a sweep: hit rate vs GPU cache size)")
    p.add_argument("--jobs", type=bounded_int(64), default=2, help="runs simulated in parallel processes (default 2)")
    p.add_argument("--gpu-hour-price", type=finite_float(0, low_open=True), default=None, metavar="USD",
                   help="rent per GPU-hour for $/hour and $ per million tokens (default: the device profile's "
                        "price, where it states one)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    sizes = p.add_argument_group("preset sizes", f"token counts of the presets' segments (the whole workload at "
                                                 f"most {MAX_SIM_TOKENS.default:,} tokens, raised with "
                                                 f"{MAX_SIM_TOKENS.env})")
    token_count = bounded_int(10**8)
    sizes.add_argument("--system-tokens", type=token_count, default=2048,
                       help="shared system prompt (shared-system-prompt, timestamp-first, multi-turn-chat; "
                            "default 2048)")
    sizes.add_argument("--user-tokens", type=token_count, default=64, help="each user message (default 64)")
    sizes.add_argument("--output-tokens", type=token_count, default=128, help="each answer (default 128)")
    sizes.add_argument("--turns", type=token_count, default=4, help="multi-turn-chat: turns per session (default 4)")
    sizes.add_argument("--documents", type=token_count, default=4, help="document-qa: distinct documents (default 4)")
    sizes.add_argument("--document-tokens", type=token_count, default=8192,
                       help="document-qa: tokens per document (default 8192)")
    sizes.add_argument("--question-tokens", type=token_count, default=32,
                       help="document-qa: each question (default 32)")
    sizes.add_argument("--input-tokens", type=token_count, default=512, help="the random preset's prompt length "
                                                                            "(default 512)")
    add_model_arguments(p)
    args = p.parse_args(argv)
    if args.concurrency and args.request_rate:
        p.error("--concurrency (closed loop) and --request-rate (open loop) do not combine")
    if args.kv_cache_tokens is not None and (args.gpu_cache_gb != "auto" or args.sweep_gpu_cache_gb is not None):
        p.error("--kv-cache-tokens gives the cache size: drop --gpu-cache-gb / --sweep-gpu-cache-gb")
    if args.sweep_gpu_cache_gb is not None:
        try:
            args.sweep_gpu_cache_gb = _gb_list(args.sweep_gpu_cache_gb)
        except ValueError as e:
            p.error(str(e))
        if args.compare:
            p.error("--sweep-gpu-cache-gb and --compare do not combine: sweep one setup at a time")
    if args.disagg:
        try:
            disagg_run.check_flags(args)
            disagg_run.parse_pools(args.disagg)
        except InputError as e:
            p.error(str(e))
    if args.routing != "round-robin" and args.instances == 1:
        warn("--routing has no effect with one instance")
    return run_main(body, args)


if __name__ == "__main__":
    sys.exit(main())
