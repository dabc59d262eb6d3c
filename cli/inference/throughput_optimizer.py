"""Best serving setup (parallel layout and load) for a model on N devices, within TTFT / TPOT limits.

    python -m cli.inference.throughput_optimizer MODEL --device DEVICE --num-devices N --input-length I
        --output-length O | --lengths-file FILE [--request-rate R | --concurrency C | --num-requests N]
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

from cost.engines import ENGINES
from cost.layout_checks import Layout as CheckedLayout, ModelFacts, check_layout
from serving.layouts import LayoutSpace, layouts
from serving.lengths import bundled_sets, read_lengths
from serving.search import (CONCURRENCY, DISAGG, MAX, MIXED, RATE, STATS, Candidate, EngineSettings, LatencyLimits,
                            Searcher, Workload, layout_error)
from serving.steady_state import Load
from serving.verify import simulate_candidate
from serving.workload import ARRIVALS
from tracer.model_source import bundled_models
from tracer.table import format_table
from tracer.trace import trace
from tracer.work import Request

from ..common import (ArgumentParser, add_device_arguments, add_model_arguments, dumps_strict, hit_rate, load_device,
                      model_spec, origin_notes, positive_int, quiet_broken_pipe, run_main, trace_options, warn)
from ..progress import Progress
from .config import InputError
from .launch_commands import LAUNCHERS, Disaggregation, Role, ServingLayout, launch_command
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
    if args.concurrency is not None:
        if requests:
            raise InputError("--num-requests with --concurrency: a closed loop is priced in its steady state; "
                             "give --num-requests alone for a finite burst")
        return Load(CONCURRENCY, float(args.concurrency))
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


def _num_devices(args, hw) -> int:
    if args.nodes is None:
        if args.num_devices is None:
            raise InputError("give --num-devices N (or --nodes K for K whole nodes)")
        return args.num_devices
    per_node = hw.gpus_per_node
    n = args.num_devices or args.nodes * per_node
    if n > args.nodes * per_node or n <= (args.nodes - 1) * per_node:
        raise InputError(f"--num-devices {n} does not fill --nodes {args.nodes} of {per_node} GPUs ({hw.name})")
    if args.nodes > 1 and hw.scale_out_bandwidth_gbps <= 0:
        raise InputError(f"{hw.name}: the profile has no scale-out network ('scale_out'), so layouts over "
                         f"{args.nodes} nodes cannot be priced")
    return n


def optimize(args, on_progress=None) -> dict:
    spec, hw, options = model_spec(args), load_device(args), trace_options(args)
    num_devices = _num_devices(args, hw)
    mix = load_hit_rate_distribution(args.prefix_cache_hit_rate_distribution) \
        if args.prefix_cache_hit_rate_distribution else None
    rate = sum(r * w for r, w in mix) if mix else args.prefix_cache_hit_rate
    defaults = ENGINES[args.engine].serving_defaults(hw.memory_capacity_gb, hw.name)
    budget = args.max_prefill_tokens or defaults.max_batched_tokens
    input_length, output_length, lengths = _lengths(args)
    shapes = ServingShapes(input_length, output_length, rate, budget, args.prefix_cache_block_size)
    workload = Workload(shapes.input_length, shapes.output_length, shapes.cached_prefix_tokens,
                        args.shared_prefix_kv, lengths)
    limits = LatencyLimits(args.ttft_limit, args.tpot_limit, args.limit_stat)
    settings = EngineSettings(args.engine, args.execution, args.max_num_seqs, budget, args.gpu_memory_utilization,
                              release=args.engine_release)
    searcher = Searcher(spec, hw, options, workload, settings, limits)
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
    steps = [(m, lay) for m in modes for lay in plan if m == MIXED or (lay.pp == 1 and not lay.attention_dp)]
    for i, (mode, lay) in enumerate(steps):
        if on_progress:
            on_progress(i, len(steps), f"{mode} {lay.label}")
        if mode == MIXED:
            best = load.kind == MAX and not load.requests
            candidates.append(searcher.best_rate(lay) if best else searcher.mixed(lay, load))
        else:
            replica = lay.gpus_per_replica
            for decode_tp in sorted({lay.tp} | {t.tp for t in plan if t.pp == 1 and not t.attention_dp}):
                decode = type(lay)(decode_tp, 1, 1, lay.ep if lay.ep <= decode_tp else 1, False, lay.ep_style)
                if replica + decode.gpus_per_replica > num_devices:
                    continue
                c = searcher.disagg(type(lay)(lay.tp, 1, 1, lay.ep, False, lay.ep_style), decode, num_devices,
                                    load.value if load.kind == RATE else None)
                if c is not None:
                    if load.kind == RATE and c.request_rate < load.value:
                        c.meets_limits = False
                        c.why_not.append(f"offered {load.value:g} requests/s exceeds the pools' "
                                         f"{c.request_rate:.3g}")
                    candidates.append(c)
    if on_progress:
        on_progress(len(steps), len(steps), "done")
    ranked = sorted(candidates, key=lambda c: (not c.meets_limits, -c.output_tokens_per_s))
    feasible = [c for c in ranked if c.meets_limits]
    if args.verify:
        # a layout that sustains no load within the limits has no steady state to simulate
        for c in [c for c in ranked if c.mode == MIXED and c.request_rate > 1e-6][:args.verify]:
            if on_progress:
                on_progress(len(steps), len(steps), f"simulating {c.layout.label}")
            c.verified = simulate_candidate(searcher, c, load)
    points = pareto_points(searcher, candidates, load, shapes, settings, limits, spec, hw, options)
    origin = searcher.cost(plan[0]).origin
    result = {
        "model": spec.name, "device": hw.name, "num_devices": num_devices, "origin": origin.as_json(),
        "nodes": math.ceil(num_devices / hw.gpus_per_node),
        "scale_up_domains": math.ceil(num_devices / hw.scale_up_gpus), "scale_up_gpus": hw.scale_up_gpus,
        "mode": args.mode, "execution": args.execution,
        "engine": args.engine if args.execution == "engine" else None,
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
        "limits": {"ttft_ms": args.ttft_limit, "tpot_ms": args.tpot_limit, "ttft_stat": args.limit_stat},
        "best": _candidate_json(feasible[0], shapes) if feasible else {},
        "candidates": [_candidate_json(c, shapes) for c in ranked[:args.top]],
        "evaluated": len(candidates), "refused_layouts": refused, "warnings": list(report.warnings),
        "pareto": {("none" if rate is None else f"{rate:g}"): [p.as_json() for p in frontier(group)]
                   for rate, group in by_hit_rate(points).items()},
    }
    if args.plot:
        plot(points, args.plot, args.ttft_limit, args.tpot_limit,
             f"{spec.name} on {num_devices} x {hw.name}, input {shapes.input_length}, output {shapes.output_length}")
    if args.emit and feasible:
        result["launch_command"] = launch_command(serving_layout(args, feasible[0], experts, hw), args.emit)
    if not feasible:
        reasons = sorted({w.split(" ")[0] for c in candidates for w in c.why_not})
        result["why_no_feasible_layout"] = (f"every layout fails on: {', '.join(reasons)}" if reasons
                                            else "no layout evaluated")
    return result


def pareto_points(searcher: Searcher, candidates: list[Candidate], load: Load, shapes: ServingShapes, settings,
                  limits, spec, hw, options) -> list[ParetoPoint]:
    """Every candidate, plus (when searching for the best rate) each mixed layout at lower loads, where users
    get faster tokens for less throughput per GPU; with a hit rate, the same layouts without prefix hits."""
    def point(c: Candidate, rate: float | None) -> ParetoPoint:
        return ParetoPoint(f"{c.mode} {c.layout.label}", c.mode, c.tokens_per_s_per_gpu, c.ttft_ms[limits.stat],
                           c.tpot_ms, c.meets_limits, rate)
    rate = shapes.prefix_cache_hit_rate if shapes.prefix_cache_hit_rate > 0 else None
    points = [point(c, rate) for c in candidates if c.tpot_ms > 0]
    if load.kind != MAX or load.requests:     # a given load (a finite burst too): no lower loads to sweep
        return points
    mixed = [c for c in candidates if c.mode == MIXED and c.meets_limits]
    for c in mixed:
        points += [point(searcher.mixed(c.layout, Load(RATE, c.request_rate * f)), rate) for f in SWEEP]
    if rate is not None:
        cold = Searcher(spec, hw, options, Workload(shapes.input_length, shapes.output_length, 0), settings, limits)
        for c in mixed:
            best = cold.best_rate(c.layout)
            points += [point(best, 0.0)] + [point(cold.mixed(c.layout, Load(RATE, best.request_rate * f)), 0.0)
                                            for f in SWEEP]
    return points


def serving_layout(args, c: Candidate, experts: int, hw) -> ServingLayout:
    """The candidate as launch flags: sizes per replica, the engine's limits the search assumed."""
    lay = c.layout
    if lay.ep > 1 and lay.ep not in (lay.tp, lay.tp * lay.dp):
        warn(f"EP {lay.ep} with TP {lay.tp} has no launch flag in these engines; the command uses EP = TP")
    ep = lay.ep if lay.ep in (lay.tp, lay.tp * lay.dp) else (lay.tp if lay.ep > 1 else 0)
    fraction = args.gpu_memory_utilization or ENGINES[args.engine].serving_defaults(hw.memory_capacity_gb,
                                                                                    hw.name).memory_fraction
    disagg = None
    if c.mode == DISAGG:
        pre = c.prefill
        disagg = Disaggregation(Role(c.prefill_instances, pre.tp, pre.ep if pre.ep == pre.tp else 0),
                                Role(c.decode_instances, lay.tp, lay.ep if lay.ep == lay.tp else 0))
    bundled = bundled_models().get(args.model.lower())
    model_id = bundled.hf_id if bundled is not None else args.model
    return ServingLayout(model_id, lay.tp, lay.pp, lay.dp if c.mode == MIXED else 1, ep, c.max_num_seqs,
                         c.max_batched_tokens, args.prefix_cache_hit_rate > 0 or
                         bool(args.prefix_cache_hit_rate_distribution), fraction,
                         "fp8" if args.kv_cache_dtype == "fp8" else "auto", experts > 0, disagg,
                         trust_remote_code=args.trust_remote_code, revision=args.revision,
                         device_memory_gb=hw.memory_capacity_gb,
                         weights_gb_per_gpu=(c.memory.weights + c.memory.activations) / 1e9 if c.memory else None)


def _candidate_json(c: Candidate, shapes: ServingShapes) -> dict:
    out = c.as_json()
    out["prefill_batch_size"] = shapes.prefill_batch_size
    # how many requests the first prefill step actually takes: the wave capacity, or fewer when fewer run
    out["first_wave_requests"] = max(1, min(shapes.prefill_batch_size, math.ceil(c.running) or 1))
    return out


def _layout_text(c: dict) -> str:
    def one(d: dict) -> str:
        s = f"TP{d['tp_size']}"
        if d["pp_size"] > 1:
            s += f" PP{d['pp_size']}"
        if d["ep_size"] > 1:
            s += f" EP{d['ep_size']}"
        return s
    if c["mode"] == DISAGG:
        return f"P{c['prefill']['instances']}x({one(c['prefill'])}) D{c['decode']['instances']}x({one(c['decode'])})"
    return one(c) + (f" ADP{c['dp_size']}" if c["attention_dp"] else f" DP{c['dp_size']}")


def render(r: dict) -> str:
    load = r["load"]
    load_text = (f"{load['requests']} requests at once" if load["kind"] == MAX and load.get("requests") else
                 "max throughput within the limits" if load["kind"] == MAX else
                 f"{load['value']:g} requests/s ({load['arrival']})" if load["kind"] == RATE else
                 f"{load['value']:g} concurrent users")
    head = (f"{r['model']} on {r['num_devices']} x {r['device']} ({r['engine'] or r['execution']}), {load_text}: "
            f"input {r['input_length']} (cached prefix {r['cached_prefix_tokens']}, effective "
            f"{r['effective_input_length']}), output {r['output_length']}, prefill budget {r['max_prefill_tokens']}")
    stat = r["limits"]["ttft_stat"]
    verified = any("verified" in c for c in r["candidates"])
    rows = []
    for c in r["candidates"]:
        tpot = (c.get("tpot_stats_ms") or {}).get(stat, c["tpot_ms"])
        row = [c["mode"], _layout_text(c), f"{c['batch_size']:.0f}", f"{c['request_rate']:.2f}",
               f"{c['ttft_ms'][stat]:.1f}", f"{tpot:.2f}", f"{c['output_tokens_per_s']:,.0f}",
               f"{c['output_tokens_per_s_per_gpu']:,.0f}", f"{c['tokens_per_s_per_user']:.1f}"]
        if verified:
            v = c.get("verified")
            ttft = v["ttft_ms"][stat] if v else None     # None: no request finished in the simulation
            sim_tpot = (v.get("tpot_q_ms") or {}).get(stat, v["tpot_ms"]) if v else None
            row += [f"{ttft:.1f}" if ttft is not None else "-", f"{sim_tpot:.2f}" if ttft is not None else "-",
                    f"{v['output_tokens_per_s']:,.0f}" if ttft is not None else "-"]
        row.append("yes" if c["meets_limits"] else "; ".join(c["why_not"]))
        rows.append(row)
    header = ["mode", "layout", "batch", "req/s", f"TTFT {stat} ms", f"TPOT {stat} ms", "tokens/s", "tokens/s/GPU",
              "tokens/s/user"]
    if verified:
        header += ["sim TTFT", "sim TPOT", "sim tokens/s"]
    table = format_table(header + ["meets limits"], rows)
    head += f"\n{r['lengths']}"
    if r["best"]:
        b = r["best"]
        tail = (f"best: {b['mode']} {_layout_text(b)}: {b['output_tokens_per_s']:,.0f} output tokens/s "
                f"({b['output_tokens_per_s_per_gpu']:,.0f} per GPU) at {b['request_rate']:.2f} requests/s, "
                f"TTFT {stat} {b['ttft_ms'][stat]:.1f} ms, TPOT {stat} "
                f"{(b.get('tpot_stats_ms') or {}).get(stat, b['tpot_ms']):.2f} ms, "
                f"{b['batch_size']:.0f} running")
        pct = b.get("tpot_stats_ms") or {}
        if pct:
            tail += ("\n      TTFT p50 / p90 / p99 " + " / ".join(f"{b['ttft_ms'][k]:.1f}" for k in ("p50", "p90", "p99"))
                     + " ms, TPOT p50 / p90 / p99 " + " / ".join(f"{pct[k]:.2f}" for k in ("p50", "p90", "p99"))
                     + " ms" + (f", {b['queue_ms']:.1f} ms mean wait for a slot" if b.get("queue_ms", 0) >= 0.05
                                else ""))
    else:
        tail = f"no feasible layout: {r['why_no_feasible_layout']}"
    notes = sorted({n for c in r["candidates"][:1] for n in c["notes"] if not n.startswith("lengths: ") or
                    "priced" in n})
    notes = [n for n in origin_notes(r["origin"]) if n not in notes] + notes
    refused = [f"refused {k}: {v}" for k, v in r["refused_layouts"].items()]
    first = [r["origin"]["headline"]] if r["origin"]["headline"] else []
    return "\n".join(first + [head, "", table, "", tail] + [f"note: {n}" for n in notes + refused])


def body(args) -> int:
    with Progress(None, "layouts") as bar:
        def on_progress(done: int, total: int, label: str) -> None:
            bar.describe(label)
            bar.set(done, total)
        result = optimize(args, on_progress)
    if args.json:
        print(dumps_strict(result, indent=1))
    else:
        print(render(result))
        if "launch_command" in result:
            print(f"\n{result['launch_command']}", end="")
    return 0


def int_list(text: str) -> list[int]:
    return [positive_int(x) for x in text.split(",") if x.strip()]


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"must be a number, got '{text}'") from None
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"must be a finite number > 0, got {text}")
    return value


def _fraction(text: str) -> float:
    value = _positive_float(text)
    if value > 1:
        raise ValueError(f"must be in (0, 1], got {text}")
    return value


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
                        "--request-rate, N arrivals at that rate; its throughput includes ramp-up and tail")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--request-rate", type=typed(_positive_float), default=None, metavar="R",
                      help="open-loop load: R requests/s over the whole deployment")
    load.add_argument("--concurrency", type=positive_int, default=None, metavar="C",
                      help="closed-loop load: C users, each sending its next request when answered")
    p.add_argument("--arrival", default="poisson", choices=ARRIVALS, help="open-loop arrivals (default poisson)")
    p.add_argument("--prefix-cache-hit-rate", type=hit_rate, default=0.0,
                   help="fraction of input tokens found in the prefix cache, in [0, 1) (default 0.0)")
    p.add_argument("--prefix-cache-block-size", type=positive_int, default=1,
                   help="count cache hits in whole blocks of this many tokens (default 1: token granularity)")
    p.add_argument("--shared-prefix-kv", action="store_true",
                   help="the cached prefix is one prefix all requests share, stored once in the KV cache (more "
                        "requests fit); default: the RFC's accounting, every request holds its whole input")
    p.add_argument("--prefix-cache-hit-rate-distribution", default=None, metavar="FILE",
                   help="per-request hit rates (JSON list or one per line); the search uses their mean")
    p.add_argument("--ttft-limit", type=typed(_positive_float), default=None, metavar="MS",
                   help="time-to-first-token limit in ms (applies to --limit-stat)")
    p.add_argument("--tpot-limit", type=typed(_positive_float), default=None, metavar="MS",
                   help="time-per-output-token limit in ms")
    p.add_argument("--limit-stat", default="mean", choices=STATS,
                   help="the TTFT and TPOT statistic the limits apply to, over requests (default mean)")
    p.add_argument("--max-prefill-tokens", type=positive_int, default=None,
                   help="tokens per engine step (the chunked-prefill budget; default: the engine's)")
    p.add_argument("--max-num-seqs", type=positive_int, default=None,
                   help="requests running at once per replica (default: the engine's)")
    p.add_argument("--gpu-memory-utilization", type=typed(_fraction), default=None,
                   help="share of GPU memory the engine plans for (default: the engine's, 0.9 for vLLM)")
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
    p.add_argument("--top", type=positive_int, default=10, help="candidates to show (default 10)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_model_arguments(p)
    args = p.parse_args(argv)
    if args.verify < 0:
        p.error("--verify must be >= 0")
    return run_main(body, args)


if __name__ == "__main__":
    sys.exit(main())
