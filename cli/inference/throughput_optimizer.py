"""Best serving setup (parallel layout and load) for a model on N devices, within TTFT / TPOT limits.

    python -m cli.inference.throughput_optimizer MODEL --device DEVICE --num-devices N --input-length I
        --output-length O | --lengths-file FILE [--request-rate R | --concurrency C] [--num-requests N]
        [--ttft-limit MS] [--tpot-limit MS] [--limit-stat mean|p50|p90|p99]
        [--prefix-cache-hit-rate H] [--mode mixed|disagg|both] [--tp-sizes ..] [--pp-sizes ..] [--ep-sizes ..]
        [--attention-dp auto|on|off] [--nodes K] [--verify N] [--plot FILE.png] [--emit vllm|sglang|trtllm]
        [--json]

Each layout is priced as the engine runs it: step costs from the fitted kernels plus the engine's overheads,
the KV cache its memory budget leaves, and the steady state of its continuous-batching scheduler at the
load (serving/steady_state.py). Without a load, each layout is taken to the highest request rate whose
latencies meet the limits. Prefix caching follows the RFC (cli/inference/shapes.py): prefill works on the
effective input length over the cached prefix, decode on the original lengths.
"""
from __future__ import annotations

import math
import sys
from dataclasses import replace

from cost.engines import ENGINES, engine_refusal
from cost.layout_checks import Layout as CheckedLayout, ModelFacts, check_layout
from serving.capacity import kv_admission
from serving.layouts import LayoutSpace, layouts
from serving.lengths import bundled_sets, read_lengths
from serving.search import (CONCURRENCY, DISAGG, MAX, MIXED, RATE, STATS, Candidate, EngineSettings, LatencyLimits,
                            Searcher, Workload, layout_error)
from serving import overload
from serving.dollars import NO_PRICE, GpuPrice, gpu_price
from serving.steady_state import Load
from serving.verify import simulate_candidate, simulate_disagg_candidate
from serving.workload import ARRIVALS
from tracer.trace import trace
from tracer.work import Request

from ..common import (ArgumentParser, add_capacity_scheduler_argument, add_device_arguments, add_endpoint_argument,
                      add_model_arguments, add_speculation_arguments, add_streaming_argument, dumps_strict, hit_rate,
                      limit_ms, load_device, model_spec, origin_notes, positive_int, quiet_broken_pipe, run_main,
                      speculations, trace_options, warn)
from ..progress import Progress
from .config import InputError
from .optimizer_table import render
from .candidate_launch import serving_layout
from .launch_commands import LAUNCHERS, launch_command
from .optimizer_flags import (MAX_TOP, check_flags, check_logged_capacity, count_devices, headroom_share, int_list,
                              memory_fraction, positive_float, top_count)
from .pareto import ParetoPoint, by_hit_rate, frontier, plot
from .shapes import ServingShapes, load_hit_rate_distribution

SWEEP = (0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.85)   # shares of a layout's best rate drawn on the Pareto plot


def _model_facts(spec, options) -> tuple[int, int]:
    """(attention heads, routed experts or 0) of the traced model."""
    t = trace(spec, Request(1, 1, 1, decode=True), options)
    heads = next((op.attention.heads for op in t.ops if op.attention is not None), 1)
    experts = next((op.experts.num_experts for op in t.ops if op.experts is not None), 0)
    return heads, experts


def _load(args) -> Load:
    requests = args.num_requests or 0
    if args.request_rate is not None:
        return Load(RATE, args.request_rate, args.arrival, requests=requests)
    if args.concurrency is not None:   # with --num-requests: N requests by C users, all ready at once
        return Load(CONCURRENCY, float(args.concurrency), requests=requests)
    return Load(MAX, requests=requests)


def _lengths(args):
    """(input length, output length, LengthDistribution or None) from the flags."""
    if args.lengths_file is None:
        if args.input_length is None or args.output_length is None:
            raise InputError("give --input-length and --output-length, or --lengths-file FILE")
        return args.input_length, args.output_length, None
    if args.input_length is not None or args.output_length is not None:
        raise InputError("--lengths-file gives every request's lengths: drop --input-length/--output-length")
    lengths = read_lengths(args.lengths_file)
    return max(1, round(lengths.mean_input)), max(1, round(lengths.mean_output)), lengths


def _hit_rate(args, warnings: list[str]) -> tuple[float, list | None]:
    """(hit rate priced, the distribution's bins or None); what is approximated goes to `warnings`."""
    if not args.prefix_cache_hit_rate_distribution:
        return args.prefix_cache_hit_rate, None
    mix = load_hit_rate_distribution(args.prefix_cache_hit_rate_distribution)
    rate = sum(r * w for r, w in mix)
    if len(mix) > 1:   # one priced rate: a request's own hit rate does not move its latency here
        warnings.append(f"--prefix-cache-hit-rate-distribution: every request is priced at the mean hit rate "
                        f"{rate:.3g}; the spread of the {len(mix)} bins (from {mix[0][0]:.3g} to {mix[-1][0]:.3g}) "
                        f"is not modelled, so latency percentiles do not include it")
    return rate, mix


def optimize(args, on_progress=None) -> dict:
    check_flags(args)
    spec, hw, options = model_spec(args), load_device(args), trace_options(args)
    num_devices = count_devices(args, hw)
    flag_warnings: list[str] = []
    if args.emit:
        why = engine_refusal(args.emit, hw.vendor, hw.name)
        if why:
            raise InputError(f"--emit {args.emit}: {why}")
        if args.emit != args.engine and args.execution == "engine":
            flag_warnings.append(f"--emit {args.emit}: the layout is ranked with {ENGINES[args.engine].label}'s "
                                 f"kernels and overheads (--engine {args.engine}); {ENGINES[args.emit].label} "
                                 f"would serve it at other speeds")
    rate, mix = _hit_rate(args, flag_warnings)
    defaults = ENGINES[args.engine].serving_defaults(hw.memory_capacity_gb, hw.name)
    budget = args.max_prefill_tokens or defaults.max_batched_tokens
    input_length, output_length, lengths = _lengths(args)
    shapes = ServingShapes(input_length, output_length, rate, budget, args.prefix_cache_block_size)
    if args.prefix_cache_block_size > int(input_length * rate) > 0:
        flag_warnings.append(f"--prefix-cache-block-size {args.prefix_cache_block_size}: hits count in whole "
                             f"blocks, and the {int(input_length * rate)} hit tokens hold none, so nothing is cached")
    for message in flag_warnings:
        warn(message)
    workload = Workload(shapes.input_length, shapes.output_length, shapes.cached_prefix_tokens,
                        args.shared_prefix_kv, lengths)
    limits = LatencyLimits(args.ttft_limit, args.tpot_limit, args.limit_stat, args.headroom)
    if args.objective == "goodput" and not limits.any:
        raise InputError("--objective goodput counts requests within the limits: give --ttft-limit and/or "
                         "--tpot-limit")
    settings = EngineSettings(args.engine, args.execution, args.max_num_seqs, budget, args.gpu_memory_utilization,
                              release=args.engine_release, streams=args.stream,
                              capacity_scheduler=args.capacity_scheduler, chat_requests=args.endpoint == "chat")
    drafts = speculations(args)
    if drafts and args.mode == DISAGG:
        raise InputError("--speculative is searched in mixed mode: use --mode mixed or both")
    logged = replace(settings, kv_cache_tokens=args.kv_cache_tokens)
    searcher = Searcher(spec, hw, options, workload, settings if drafts else logged, limits)
    # each speculative setup is a searcher of its own, beside the one without speculation
    searchers = [searcher] + [Searcher(spec, hw, options, workload, replace(logged, speculation=d), limits)
                              for d in drafts]
    heads, experts = _model_facts(spec, options)
    if args.ep_sizes and not experts:
        raise InputError(f"--ep-sizes: {spec.name} has no routed experts")
    if args.attention_dp == "on" and not experts:
        raise InputError(f"--attention-dp on: {spec.name} has no routed experts to share across DP ranks")
    space = LayoutSpace(tuple(args.tp_sizes) if args.tp_sizes else None,
                        tuple(args.pp_sizes) if args.pp_sizes else None,
                        tuple(args.ep_sizes) if args.ep_sizes else None, args.attention_dp, args.ep_style)
    plan = layouts(num_devices, heads, experts, space)
    refused = {}
    for lay in plan:
        why = layout_error(lay, hw)
        if why is None and lay.tp > 1 and heads % lay.tp:
            why = f"TP {lay.tp} does not divide the {heads} attention heads"
        if why:
            refused[lay.label] = why
    plan = [lay for lay in plan if lay.label not in refused]
    check_logged_capacity(args, plan, bool(drafts))
    if not plan:
        raise InputError("no layout to search: " + "; ".join(f"{k}: {v}" for k, v in refused.items())
                         if refused else f"no layout of {num_devices} devices fits the given sizes")
    # per-layout rules are applied above; this states what holds for every layout (lengths beyond the context)
    report = check_layout(ModelFacts.from_config(spec.config, spec.name), CheckedLayout(devices=num_devices),
                          shapes.input_length + shapes.output_length)
    for message in report.warnings:
        warn(message)
    load = _load(args)
    modes = [MIXED, DISAGG] if args.mode == "both" else [args.mode]
    candidates: list[Candidate] = []
    steps = [(m, lay, s) for m in modes for lay in plan for s in (searchers if m == MIXED else [searcher])
             if m == MIXED or (lay.pp == 1 and not lay.attention_dp)]
    for i, (mode, lay, srch) in enumerate(steps):
        if on_progress:
            on_progress(i, len(steps), f"{mode} {lay.label}" + (f" {srch.settings.speculation.label}"
                                                                 if srch.settings.speculation else ""))
        if mode == MIXED:
            best = load.kind == MAX and not load.requests
            search = srch.best_goodput if args.objective == "goodput" else srch.best_rate
            candidates.append(search(lay) if best else srch.mixed(lay, load))
        else:
            replica = lay.gpus_per_replica
            for decode_tp in sorted({lay.tp} | {t.tp for t in plan if t.pp == 1 and not t.attention_dp}):
                decode = type(lay)(decode_tp, 1, 1, lay.ep if lay.ep <= decode_tp else 1, False, lay.ep_style)
                if replica + decode.gpus_per_replica > num_devices:
                    continue
                c = searcher.disagg(type(lay)(lay.tp, 1, 1, lay.ep, False, lay.ep_style), decode, num_devices,
                                    load.value if load.kind == RATE else None)
                if c is not None:
                    candidates.append(c)
    if on_progress:
        on_progress(len(steps), len(steps), "done")
    overloads = [m for c in candidates for m in flag_overload(c, load)]
    ranked = rank(candidates, args.objective)
    by_draft = {s.settings.speculation.label if s.settings.speculation else None: s for s in searchers}
    for c in ranked[:args.top]:     # a mean at a rate near capacity is a range: say how wide
        note = by_draft[c.speculation].rate_sensitivity(c.layout, load) if c.mode == MIXED else None
        if note:
            c.notes.append(note)
    if args.verify:
        # a layout that sustains no load within the limits has no steady state to simulate
        for c in [c for c in ranked if c.request_rate > 1e-6][:args.verify]:
            if on_progress:
                on_progress(len(steps), len(steps), f"simulating {c.mode} {c.layout.label}")
            overrule(c, simulate_candidate(searcher, c, load) if c.mode == MIXED else
                     simulate_disagg_candidate(searcher, c, load))
        ranked = rank(candidates, args.objective)
    feasible = [c for c in ranked if (c.goodput > 0 if args.objective == "goodput" else c.meets_limits)]
    price = gpu_price(hw, args.gpu_hour_price)
    points = pareto_points(searcher, candidates, load, shapes, limits)
    origin = searcher.cost(plan[0]).origin
    result = {
        "model": spec.name, "device": hw.name, "num_devices": num_devices, "origin": origin.as_json(),
        "nodes": math.ceil(num_devices / hw.gpus_per_node),
        "scale_up_domains": math.ceil(num_devices / hw.scale_up_gpus), "scale_up_gpus": hw.scale_up_gpus,
        "mode": args.mode, "execution": args.execution,
        "engine": args.engine if args.execution == "engine" else None, "streams": args.stream,
        "endpoint": args.endpoint,
        "kv_admission": kv_admission(args.engine, args.capacity_scheduler) if args.execution == "engine" else None,
        "load": {"kind": load.kind, "value": load.value if load.kind != MAX else None,
                 "arrival": load.arrival if load.kind == RATE else None, "requests": load.requests or None},
        "lengths": workload.describe(), "length_distribution": lengths.as_json() if lengths else None,
        "input_length": shapes.input_length, "output_length": shapes.output_length,
        "prefix_cache_hit_rate": shapes.prefix_cache_hit_rate, "cached_prefix_tokens": shapes.cached_prefix_tokens,
        "shared_prefix_kv": args.shared_prefix_kv,
        "effective_input_length": shapes.effective_input_length, "max_prefill_tokens": budget,
        "prefill_chunked": shapes.chunked, "prefix_cache_block_size": shapes.prefix_cache_block_size,
        # RFC 4.3: requests one prefill wave holds under the token budget (not a batch size anyone configured)
        "prefill_batch_size": shapes.prefill_batch_size,
        "hit_rate_distribution": [{"rate": r, "weight": w} for r, w in mix] if mix else None,
        "limits": limits.as_json(), "objective": args.objective,
        "best": _candidate_json(feasible[0], shapes, price) if feasible else {},
        # the top candidates, and every one simulated (a simulation may have moved it below the top)
        "candidates": [_candidate_json(c, shapes, price) for c in ranked[:args.top] +
                       [c for c in ranked[args.top:] if c.verified]],
        "price": {"usd_per_gpu_hour": price.usd_per_gpu_hour, "origin": price.origin} if price else None,
        "price_note": price.note if price else NO_PRICE,
        "evaluated": len(candidates), "refused_layouts": refused,
        "warnings": flag_warnings + list(report.warnings) + overloads + [m for c in ranked if c.verified
                                                         for m in c.verified.get("overload", [])],
        "pareto": {("none" if rate is None else f"{rate:g}"): [p.as_json() for p in frontier(group)]
                   for rate, group in by_hit_rate(points).items()},
        "speculation": _speculation_summary(drafts, candidates),
    }
    if args.plot:
        plot(points, args.plot, args.ttft_limit, args.tpot_limit,
             f"{spec.name} on {num_devices} x {hw.name}, input {shapes.input_length}, output {shapes.output_length}",
             price.usd_per_gpu_hour if price else None)
    if args.emit and feasible:
        result["launch_command"] = launch_command(
            serving_layout(args, feasible[0], experts, hw, spec, workload.longest_request), args.emit)
    if not feasible:
        reasons = sorted({w.split(" ")[0] for c in candidates for w in c.why_not})
        result["why_no_feasible_layout"] = (f"every layout fails on: {', '.join(reasons)}" if reasons
                                            else "no layout evaluated")
    return result


def flag_overload(c: Candidate, load: Load) -> list[str]:
    """A load the candidate cannot serve fails it, whatever the limits: an open-loop rate beyond what it serves,
    more users than it runs at once. Returns the warnings, naming the layout."""
    where = f" ({c.label})"
    if load.kind == CONCURRENCY:
        slots = c.max_num_seqs * (c.decode_instances if c.mode == DISAGG else c.layout.dp)
        message = overload.users_beyond_slots(int(load.value), slots, where)
    elif load.kind == RATE:
        message = overload.rate_beyond_served(load.value, c.request_rate, where)
    else:
        message = None
    if message is None:
        return []
    c.meets_limits = False
    c.why_not = [w for w in c.why_not if not w.startswith("offered ")] + [message]
    c.overload = True
    return [message]


def overrule(c: Candidate, verified: dict) -> None:
    """Attach the simulation of a candidate; one that breaks a limit in the simulation does not meet the limits,
    whatever the steady-state model said."""
    c.verified = verified
    if c.meets_limits and not verified["meets_limits"]:
        c.meets_limits = False
        c.why_not.append("simulated " + "; ".join(verified["why_not"]))


def rank(candidates: list[Candidate], objective: str) -> list[Candidate]:
    """Best first: by goodput, or by output tokens/s among those within the limits."""
    if objective == "goodput":
        return sorted(candidates, key=lambda c: (-c.goodput, -c.output_tokens_per_s))
    return sorted(candidates, key=lambda c: (not c.meets_limits, -c.output_tokens_per_s))


def pareto_points(searcher: Searcher, candidates: list[Candidate], load: Load, shapes: ServingShapes,
                  limits: LatencyLimits) -> list[ParetoPoint]:
    """Every candidate, plus (when searching for the best rate) each mixed layout at lower loads, where users
    get faster tokens for less throughput per GPU; with a hit rate, the same layouts without prefix hits."""
    def point(c: Candidate, rate: float | None) -> ParetoPoint:
        return ParetoPoint(c.label, c.mode, c.tokens_per_s_per_gpu, c.ttft_ms[limits.stat],
                           c.tpot_ms, c.meets_limits, rate)
    rate = shapes.prefix_cache_hit_rate if shapes.prefix_cache_hit_rate > 0 else None
    points = [point(c, rate) for c in candidates if c.tpot_ms > 0]
    if load.kind != MAX or load.requests:     # a given load (a finite burst too): no lower loads to sweep
        return points
    mixed = [c for c in candidates if c.mode == MIXED and c.meets_limits]
    for c in mixed:
        points += [point(searcher.mixed(c.layout, Load(RATE, c.request_rate * f), probe=True), rate) for f in SWEEP]
    if rate is not None:
        cold = searcher.with_workload(Workload(shapes.input_length, shapes.output_length, 0))
        for c in mixed:
            best = cold.best_rate(c.layout)
            points += [point(best, 0.0)] + [point(cold.mixed(c.layout, Load(RATE, best.request_rate * f), probe=True),
                                                  0.0) for f in SWEEP]
    return points


def _speculation_summary(drafts, candidates: list[Candidate]) -> dict | None:
    """Per speculative setup (and none): its best output tokens/s within the limits, so that a setup that loses
    (speculation at high batch) is seen losing."""
    if not drafts:
        return None
    best: dict = {}
    for c in candidates:
        if c.mode == MIXED and c.meets_limits:
            key = c.speculation or "none"
            best[key] = max(best.get(key, 0.0), c.output_tokens_per_s)
    setups = [{"setup": d.label, "method": d.method_name, "tree": d.tree, "tokens_per_step": d.tokens_per_step,
               "acceptance": list(d.acceptance), "source": d.source, "best_output_tokens_per_s": best.get(d.label)}
              for d in drafts]
    base = best.get("none")
    winner = max(best, key=best.get) if best else None
    return {"setups": setups, "without_output_tokens_per_s": base, "winner": winner}


def _candidate_json(c: Candidate, shapes: ServingShapes, price: GpuPrice | None = None) -> dict:
    out = c.as_json()
    out["dollars"] = price.of(c.gpus, c.output_tokens_per_s, c.total_tokens_per_s) if price else None
    out["prefill_batch_size"] = shapes.prefill_batch_size
    # how many requests the first prefill step actually takes: the wave capacity, or fewer when fewer run
    out["first_wave_requests"] = max(1, min(shapes.prefill_batch_size, math.ceil(c.running) or 1))
    return out


def body(args) -> int:
    with Progress(None, "layouts") as bar:
        def on_progress(done: int, total: int, label: str) -> None:
            bar.describe(label)
            bar.set(done, total)
        result = optimize(args, on_progress)
    if args.json:
        print(dumps_strict(result, indent=1))
    else:
        print(render(result, args.wide, origin_notes(result["origin"])))
        if "launch_command" in result:
            print(f"\n{result['launch_command']}", end="")
    return 0


@quiet_broken_pipe
def main(argv=None) -> int:
    import argparse

    def typed(fn):
        def parse(text):
            try:
                return fn(text)
            except ValueError as e:
                raise argparse.ArgumentTypeError(str(e)) from None
        return parse

    p = ArgumentParser(prog="throughput-optimizer", description=__doc__.split("\n")[0])
    p.add_argument("model", help="bundled model name, folder or config.json path, or HF id in the local cache")
    add_device_arguments(p)
    p.add_argument("--num-devices", type=positive_int, default=None, help="GPUs to deploy on")
    p.add_argument("--nodes", type=positive_int, default=None,
                   help="nodes (hosts) the GPUs span (the profile's gpus_per_node each: 4 per GB200 NVL72 tray); "
                        "collectives beyond the scale-up domain (a node, or a whole NVL72 rack) are priced on the "
                        "scale-out network")
    p.add_argument("--input-length", type=positive_int, default=None, help="prompt tokens per request")
    p.add_argument("--output-length", type=positive_int, default=None, help="generated tokens per request")
    p.add_argument("--lengths-file", default=None, metavar="FILE",
                   help="per-request lengths instead of fixed ones: a CSV (header with input_length, "
                        "output_length) or JSONL file, or a bundled set (" + ", ".join(bundled_sets()) + ")")
    p.add_argument("--num-requests", type=positive_int, default=None, metavar="N",
                   help="a finite run of N requests: alone, all sent at once (as vllm bench serve does); with "
                        "--request-rate, N arrivals at that rate; with --concurrency, N requests by C users "
                        "(--max-concurrency C --num-prompts N); its throughput includes ramp-up and tail")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--request-rate", type=typed(positive_float), default=None, metavar="R",
                      help="open-loop load: R requests/s over the whole deployment")
    load.add_argument("--concurrency", type=positive_int, default=None, metavar="C",
                      help="closed-loop load: C users, each sending its next request when answered")
    p.add_argument("--arrival", default="poisson", choices=ARRIVALS, help="open-loop arrivals (default poisson)")
    hits = p.add_mutually_exclusive_group()
    hits.add_argument("--prefix-cache-hit-rate", type=hit_rate, default=0.0,
                      help="fraction of input tokens found in the prefix cache, in [0, 1) (default 0.0)")
    p.add_argument("--prefix-cache-block-size", type=positive_int, default=1,
                   help="count cache hits in whole blocks of this many tokens (default 1: token granularity)")
    p.add_argument("--shared-prefix-kv", action="store_true",
                   help="the cached prefix is one prefix all requests share, stored once in the KV cache (more "
                        "requests fit); default: the RFC's accounting, every request holds its whole input")
    hits.add_argument("--prefix-cache-hit-rate-distribution", default=None, metavar="FILE",
                      help="per-request hit rates (JSON list or one per line); the search uses their mean")
    p.add_argument("--ttft-limit", type=limit_ms, default=None, metavar="MS",
                   help="time-to-first-token limit in ms (applies to --limit-stat; inf: no limit)")
    p.add_argument("--tpot-limit", type=limit_ms, default=None, metavar="MS",
                   help="time-per-output-token limit in ms (inf: no limit)")
    p.add_argument("--limit-stat", default="mean", choices=STATS,
                   help="the TTFT and TPOT statistic the limits apply to, over requests (default mean)")
    p.add_argument("--headroom", type=typed(headroom_share), default=0.0, metavar="F",
                   help="keep this share below each limit (0.1: aim at 90%% of it; default 0)")
    p.add_argument("--objective", default="throughput", choices=["throughput", "goodput"],
                   help="rank by output tokens/s within the limits (default), or by goodput: requests/s that "
                        "finish within every limit, as vllm bench serve --goodput counts them")
    p.add_argument("--gpu-hour-price", type=typed(positive_float), default=None, metavar="USD",
                   help="rent per GPU-hour for $/hour and $ per million tokens (default: the device profile's "
                        "price, where it states one)")
    p.add_argument("--wide", action="store_true", help="every column, and the full reasons a candidate fails")
    p.add_argument("--max-prefill-tokens", type=positive_int, default=None,
                   help="tokens per engine step (the chunked-prefill budget; default: the engine's)")
    p.add_argument("--max-num-seqs", type=positive_int, default=None,
                   help="requests running at once per replica (default: the engine's)")
    p.add_argument("--gpu-memory-utilization", type=typed(memory_fraction), default=None,
                   help="share of GPU memory the engine plans for (default: the engine's, 0.9 for vLLM)")
    p.add_argument("--kv-cache-tokens", type=positive_int, default=None, metavar="N",
                   help="the KV capacity per replica your engine logged for this layout (vLLM: 'GPU KV cache "
                        "size: N tokens'), priced instead of tracecost's estimate; one layout only, and with "
                        "--speculative the speculating server's (default: estimated from memory)")
    add_capacity_scheduler_argument(p)
    p.add_argument("--mode", default=MIXED, choices=[MIXED, DISAGG, "both"],
                   help="mixed: prefill and decode on the same instances; disagg: separate prefill and decode "
                        "pools, each with its own TP")
    p.add_argument("--tp-sizes", type=typed(int_list), default=None, help="comma list (default: powers of 2)")
    p.add_argument("--pp-sizes", type=typed(int_list), default=None, help="pipeline sizes to try (default 1)")
    p.add_argument("--ep-sizes", type=typed(int_list), default=None,
                   help="expert-parallel sizes to try, independent of TP (default 1 and TP)")
    p.add_argument("--attention-dp", default="auto", choices=["auto", "on", "off"],
                   help="attention data parallel with EP over all ranks (auto: try it for MoE models)")
    p.add_argument("--verify", type=int, default=0, metavar="N",
                   help="re-run the top N mixed candidates in the event simulator and show both")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="draw tokens/s/GPU against tokens/s/user, the Pareto frontier marked (needs matplotlib)")
    p.add_argument("--emit", default=None, choices=list(LAUNCHERS),
                   help="print the best layout as this engine's launch command")
    add_speculation_arguments(p, several=True)
    add_streaming_argument(p)
    add_endpoint_argument(p)
    p.add_argument("--top", type=typed(top_count), default=10,
                   help=f"candidates to show (default 10, at most {MAX_TOP})")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_model_arguments(p)
    args = p.parse_args(argv)
    if args.verify < 0:
        p.error("--verify must be >= 0")
    return run_main(body, args)


if __name__ == "__main__":
    sys.exit(main())
