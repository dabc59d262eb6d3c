"""Latency of one prefill (TTFT) or decode step (TPOT) of a model on a device, with prefix caching; or, with
--output-length, of whole requests (one batch served to the end, as `vllm bench latency` runs it).

    python -m cli.inference.text_generate MODEL --device DEVICE --num-queries B --query-length Q
        [--context-length C] [--decode] [--prefix-cache-hit-rate H] [--tp-size N] [--json]
    python -m cli.inference.text_generate MODEL --device DEVICE -b B -q Q --output-length N [--json]
    python -m cli.inference.text_generate MODEL --device DEVICE -b B -c C --decode --speculative METHOD
        [--num-speculative-tokens K] [--acceptance-rate A | --acceptance-length L] [--json]
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

from cost.engines import ENGINES, nearest_release, resolve_overheads
from cost.estimate import BREAKDOWN_CLASSES, Estimate, Parallelism, estimate
from cost.kernels import COMPUTE, MEMORY, OVERHEAD
from cost.op_formats import expert_resident
from cost.profile import HardwareProfile, load_profile
from tracer.model_source import ModelSpec, resolve_model
from tracer.table import format_table, human
from tracer.trace import trace
from tracer.work import Trace

from ..common import (MAX_BATCH_TOKENS, MAX_SWEEP, MAX_TOKENS, ArgumentParser, Layout, add_device_arguments,
                      add_model_arguments, add_speculation_arguments, check_layout_or_fail, check_plot_path,
                      dumps_strict, hit_rate, model_spec, positive_int, quiet_broken_pipe, run_main, speculations,
                      trace_options, warn)
from ..progress import Progress
from .config import InputError, RequestInfo, UserInputConfig
from .memory import MemoryEstimate, estimate_memory
from . import speculative_step, whole_request

MEMORY_NOTE = ("KV memory covers the request's seq_len; resident prefix-cache memory beyond it is not modelled "
               "(RFC 5.3)")


@dataclass
class Result:
    model: str
    hw: HardwareProfile
    config: UserInputConfig
    info: RequestInfo
    trace: Trace
    estimate: Estimate
    memory: MemoryEstimate

    @property
    def phase(self) -> str:
        return "decode" if self.info.decode else "prefill"

    @property
    def throughput(self) -> float:
        """Prefill: prompt tokens served per second (cache hits included); decode: tokens generated per second."""
        tokens = self.info.num_queries * (1 if self.info.decode else self.config.query_length)
        return tokens / self.estimate.wall_s

    def as_json(self) -> dict:
        e, info = self.estimate, self.info
        return {
            "model": self.model, "device": self.hw.name, "phase": self.phase, "execution": e.execution,
            "tp_size": e.parallelism.tp, "ep_size": e.parallelism.ep, "dtype": self.trace.options.dtype,
            "request": {"num_queries": info.num_queries, "query_length": info.query_len,
                        "context_length": info.context_len, "seq_len": info.seq_len,
                        "prefix_cache_hit_rate": self.config.prefix_cache_hit_rate if self.config.hit_rate_applies
                        else 0.0, "cached_tokens": info.cached_tokens,
                        "original_query_length": self.config.query_length,
                        "original_context_length": self.config.context_length,
                        "image_tokens": self.trace.image_tokens},
            "latency_ms": e.latency_s * 1e3,
            "host_ms": e.host_s * 1e3, "wall_ms": e.wall_s * 1e3,
            "breakdown_ms": {c: e.breakdown_s[c] * 1e3 for c in BREAKDOWN_CLASSES},
            "bound_ms": {b: e.bound_s[b] * 1e3 for b in (COMPUTE, MEMORY, OVERHEAD)},
            "flops": e.flops, "bytes": e.bytes, "num_kernels": e.num_kernels,
            "throughput_tokens_per_s": self.throughput,
            "memory_gb": self.memory.as_gb(), "fits_in_memory": self.memory.fits,
            "top_ops": [{"name": n, "class": c, "ms": s * 1e3, "launches": k, "bound": b}
                        for n, c, s, k, b in e.top(10)],
            "engine": e.engine, "ep_style": e.parallelism.ep_style if e.parallelism.ep > 1 else None,
            "notes": self.notes, "origin": e.origin.as_json() if e.origin else None,
        }

    @property
    def notes(self) -> list[str]:
        efficiency = [] if self.estimate.engine else [f"efficiency: {self.hw.efficiency.origin}"]
        return self.trace.notes + [MEMORY_NOTE] + self.estimate.notes + efficiency + self.budget_notes

    @property
    def budget_notes(self) -> list[str]:
        """A prefill larger than the engine's step budget is priced as one step here; the engine splits it."""
        if self.info.decode or not self.estimate.engine:
            return []
        budget = ENGINES[self.estimate.engine].serving_defaults(self.hw.memory_capacity_gb,
                                                                self.hw.name).max_batched_tokens
        tokens = self.info.num_queries * self.info.query_len
        if tokens <= budget:
            return []
        return [f"priced as one step of {tokens:,} tokens; {self.estimate.engine} runs at most {budget:,} tokens per "
                f"step (max_num_batched_tokens), {-(-tokens // budget)} steps: --output-length N walks the "
                f"engine's chunks"]


def predict(model: str | ModelSpec, device: str, config: UserInputConfig, tp: int = 1, ep: int = 1, execution: str = "engine",
            options=None, engine: str = "vllm", ep_style: str = "all-tokens", release: str | None = None) -> Result:
    """`release`: the engine release whose kernels price the step, where the device has tables of it."""
    from tracer.work import TraceOptions
    hw = load_profile(device)
    if execution == "engine":
        hw = hw.at_engine_release(release)
        hw.engine(engine)       # an engine that does not run on the device is refused before tracing
    info = config.get_request_info()
    spec = model if isinstance(model, ModelSpec) else resolve_model(model)
    t = trace(spec, info.to_request(), options or TraceOptions())
    est = estimate(t, hw, execution, Parallelism(tp, ep, ep_style), engine)
    # one unit throughout, GB of 10^9 bytes; the capacity is what the driver reports (cost/profile.py memory_bytes)
    memory = estimate_memory(t, info.num_queries * info.seq_len, tp, ep, hw.memory_bytes / 1e9,
                             sequences=info.num_queries,
                             expert_resident=expert_resident(t, engine, hw, execution))
    return Result(spec.name, hw, config, info, t, est, memory)


def render(r: Result) -> str:
    e, info, m = r.estimate, r.info, r.memory
    label = "TPOT (decode step)" if info.decode else "TTFT (prefill)"
    how = f"{e.engine} engine kernels" if e.engine else f"{e.execution} execution"
    first = [e.origin.headline()] if e.origin and e.origin.headline() else []
    lines = first + [f"{r.model} on {r.hw.name} x{e.parallelism.tp} (TP={e.parallelism.tp}"
             f"{f', EP={e.parallelism.ep} ({e.parallelism.ep_style})' if e.parallelism.ep > 1 else ''}), {how}, "
             f"{r.trace.options.dtype}",
             f"{r.phase}: batch={info.num_queries} query={info.query_len} context={info.context_len} "
             f"seq_len={info.seq_len}" + (f"  (prefix cache: {info.cached_tokens} of {r.config.query_length} query "
                                          f"tokens hit, rate {r.config.prefix_cache_hit_rate})"
                                          if r.config.hit_rate_applies else ""),
             *([f"image tokens: {r.trace.image_tokens} per sequence, run as prefill input through the language "
                f"model ({info.query_len} text + {r.trace.image_tokens} image tokens per sequence)"]
               if r.trace.image_tokens else []),
             "",
             f"{label}: {e.latency_s * 1e3:.3f} ms of kernels    throughput: {r.throughput:,.0f} tokens/s",
             *([f"host launches: {e.host_s * 1e3:.3f} ms"
                + ("  (HOST-BOUND: the step takes {:.3f} ms of wall time)".format(e.wall_s * 1e3)
                   if e.host_s > e.latency_s else "")] if e.host_s > 0 else []),   # an engine's graphs: none
             ""]
    shown = lambda seconds: round(seconds * 1e3, 3) != 0   # noqa: E731 -- a zero row says nothing
    rows = [[c, f"{e.breakdown_s[c] * 1e3:.3f}", f"{e.breakdown_s[c] / e.latency_s * 100:.1f}%"]
            for c in BREAKDOWN_CLASSES if shown(e.breakdown_s[c])]
    lines.append(format_table(["class", "ms", "share"], rows))
    lines.append("")
    lines.append(format_table(["bound", "ms"], [[b, f"{e.bound_s[b] * 1e3:.3f}"] for b in (COMPUTE, MEMORY, OVERHEAD)
                                                if shown(e.bound_s[b])]))
    lines.append("")
    lines.append(format_table(["top ops", "class", "ms", "launches", "bound"],
                              [[n, c, f"{s * 1e3:.3f}", k, b] for n, c, s, k, b in e.top(8)]))
    lines.append("")
    g = m.as_gb()
    lines.append(format_table(["memory per device", "GB"], [[k, f"{v:.2f}"] for k, v in g.items()
                                                             if f"{v:.2f}" != "0.00"
                                                             or k in ("weights", "total", "capacity")],
                              title="memory in GB of 10^9 bytes (capacity: the "
                                    f"{r.hw.memory_bytes / 2**30:.2f} GiB the driver reports"
                                    f"{'' if r.hw.memory_usable_stated else ' (estimated)'} = {g['capacity']:.2f} GB)"))
    if not m.fits:
        lines.append(f"WARNING: needs {g['total']:.1f} GB per device but {r.hw.name} has {g['capacity']:.0f} GB: "
                     f"does not fit (raise --tp-size or lower the batch)")
    lines.append(f"FLOPs {human(e.flops, 'FLOP')}, bytes {human(e.bytes, 'B')}, {e.num_kernels} kernels")
    for note in r.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def sweep(args, spec: ModelSpec, options, rates: list[float]) -> int:
    results = []
    with Progress(len(rates), "hit rates") as bar:   # the first rates trace the model; each rate is a new shape
        for rate in rates:
            config = UserInputConfig(args.num_queries, args.query_length, args.context_length, False, rate)
            results.append(predict(spec, args.device, config, args.tp_size, args.ep_size, args.execution, options,
                                   args.engine, args.ep_style, args.engine_release))
            bar.update()
    base = results[0].estimate.latency_s if rates[0] == 0 else None
    if base is None:
        base = predict(spec, args.device, UserInputConfig(args.num_queries, args.query_length, args.context_length),
                       args.tp_size, args.ep_size, args.execution, options, args.engine,
                       args.ep_style, args.engine_release).estimate.latency_s
    rows = [{"prefix_cache_hit_rate": r.config.prefix_cache_hit_rate, "cached_tokens": r.info.cached_tokens,
             "effective_query_length": r.info.query_len, "ttft_ms": r.estimate.latency_s * 1e3,
             "prefill_tokens_per_s": r.throughput, "speedup": base / r.estimate.latency_s} for r in results]
    if args.json:
        print(dumps_strict({"model": results[0].model, "device": results[0].hw.name, "sweep": rows,
                            "warnings": list(args.layout_warnings)}, indent=1))
    else:
        print(format_table(["hit rate", "cached tokens", "computed tokens", "TTFT ms", "prefill tokens/s", "speedup"],
                           [[f"{x['prefix_cache_hit_rate']:g}", x["cached_tokens"], x["effective_query_length"],
                             f"{x['ttft_ms']:.2f}", f"{x['prefill_tokens_per_s']:,.0f}", f"{x['speedup']:.2f}x"]
                            for x in rows],
                           title=f"{results[0].model} on {results[0].hw.name}: what prefix caching buys "
                                 f"(batch {args.num_queries}, query {args.query_length}, context {args.context_length})"))
    if args.plot:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            warn("--plot needs matplotlib (pip install 'tracecost[plot]'); no plot written")
            return 0
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([x["prefix_cache_hit_rate"] for x in rows], [x["ttft_ms"] for x in rows], marker="o")
        ax.set_xlabel("prefix cache hit rate")
        ax.set_ylabel("TTFT (ms)")
        ax.set_title(f"{results[0].model} on {results[0].hw.name}")
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        try:
            fig.savefig(args.plot)
        except (OSError, ValueError) as e:   # ValueError: an extension matplotlib cannot write
            raise InputError(f"--plot {args.plot}: {e}") from None
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def check_work(args) -> None:
    """Bounded work, before the model is fetched or traced."""
    MAX_TOKENS.check(args.context_length + args.query_length + (args.output_length or 0),
                     "--context-length + --query-length + --output-length")
    if args.output_length is not None:
        for given, flag in ((args.decode, "--decode"), (args.context_length, "--context-length"),
                            (args.prefix_cache_hit_rate, "--prefix-cache-hit-rate"),
                            (args.sweep_prefix_cache_hit_rate is not None, "--sweep-prefix-cache-hit-rate")):
            if given:
                raise InputError(f"--output-length serves whole requests from their prompt (-q): {flag} is for "
                                 f"the single-step modes")
        MAX_BATCH_TOKENS.check(args.num_queries * (args.query_length + args.output_length),
                               "--num-queries x (--query-length + --output-length)")
    elif args.max_prefill_tokens is not None or args.max_running is not None or not args.chunked_prefill:
        raise InputError("--max-prefill-tokens, --max-running and --no-chunked-prefill set the scheduler of "
                         "--output-length")
    MAX_BATCH_TOKENS.check(args.num_queries * (args.query_length + (args.context_length if args.decode else 0)),
                           "--num-queries x tokens per sequence")
    if args.sweep_prefix_cache_hit_rate is not None:
        MAX_SWEEP.check(len(args.sweep_prefix_cache_hit_rate), "--sweep-prefix-cache-hit-rate points")
    if args.plot is not None and args.sweep_prefix_cache_hit_rate is None:
        raise InputError("--plot draws the hit-rate sweep: add --sweep-prefix-cache-hit-rate R1,R2,...")
    check_plot_path(args.plot)


def release_kernels_warning(engine: str, release: str) -> str | None:
    """A single step prices the kernel fits' own release; an older release's steps take its kernel time
    (cost/engines.py ServingOverheads.kernel_time), which whole requests (--output-length) pay."""
    r = resolve_overheads(engine, nearest_release(engine, release))
    if r.params.kernel_time == 1.0:
        return None
    return (f"{ENGINES[engine].label} {r.release}'s steps take {r.params.kernel_time:.3g}x the kernel times shown "
            f"(its fitted kernel_time); this single step is priced with the kernel fits' own release (and the "
            f"device's tables of {release} where it has them), --output-length N prices whole requests with it")


def body(args) -> int:
    options = trace_options(args)
    check_work(args)
    spec = model_spec(args)   # resolved (for a Hub id: fetched) once for every prediction below
    args.layout_warnings = check_layout_or_fail(spec.config, spec.name, Layout(tp=args.tp_size, ep=args.ep_size),
                                                args.context_length + args.query_length + (args.output_length or 0),
                                                args.moe_imbalance, args.ep_style).warnings
    drafts = speculations(args)
    if len(drafts) > 1:
        raise InputError("text_generate prices one speculative setup, one --speculative method and one "
                         "--num-speculative-tokens (the optimizer searches several)")
    args.speculation = drafts[0] if drafts else None
    if args.output_length is not None:
        return whole(args, spec, options)
    if drafts:       # a speculative step is priced as serving prices it (StepCost), its release's kernels included
        return speculative_decode(args, spec, options)
    if args.execution == "engine" and args.engine_release:
        older = release_kernels_warning(args.engine, args.engine_release)
        if older:
            warn(older)
            args.layout_warnings = [*args.layout_warnings, older]
    if args.sweep_prefix_cache_hit_rate is not None:
        if args.decode:
            raise ValueError("--sweep-prefix-cache-hit-rate is for prefill, not --decode")
        return sweep(args, spec, options, args.sweep_prefix_cache_hit_rate)
    if args.decode and args.prefix_cache_hit_rate > 0:
        warn("--prefix-cache-hit-rate applies to prefill only; ignored for --decode (RFC 5.2)")
    if args.decode and not args.context_given:
        warn("--decode without --context-length prices a decode step over an empty KV cache (context 0); "
             "give -c, or --output-length N for every decode step of whole requests")
    query = 1 if args.decode and args.query_length is None else args.query_length
    config = UserInputConfig(args.num_queries, query, args.context_length, args.decode, args.prefix_cache_hit_rate)
    result = predict(spec, args.device, config, args.tp_size, args.ep_size, args.execution, options,
                     args.engine, args.ep_style, args.engine_release)
    if args.json:
        print(dumps_strict({**result.as_json(), "warnings": list(args.layout_warnings)}, indent=1))
    else:
        print(render(result))   # the layout's warnings went to stderr
    return 0


def whole(args, spec: ModelSpec, options) -> int:
    r = whole_request.predict(spec, args.device, args.num_queries, args.query_length, args.output_length,
                              args.tp_size, args.ep_size, args.execution, options, args.engine, args.ep_style,
                              args.engine_release, args.max_prefill_tokens, args.max_running, args.chunked_prefill,
                              args.speculation)
    for warning in r.warnings:
        warn(warning)
    if args.json:
        print(dumps_strict({**r.as_json(), "warnings": list(args.layout_warnings) + r.warnings}, indent=1))
    else:
        print(whole_request.render(r))
    return 0


def speculative_decode(args, spec: ModelSpec, options) -> int:
    """--speculative --decode: one speculative step of -b requests over -c tokens of context."""
    if not args.decode:
        raise InputError("--speculative prices decode steps: add --decode (one step over -c) or --output-length N "
                         "(whole requests)")
    if args.query_length != 1 or args.prefix_cache_hit_rate:
        raise InputError("--speculative sets a decode step's query (the verified tokens): drop -q and "
                         "--prefix-cache-hit-rate")
    r = speculative_step.predict(spec, args.device, args.num_queries, args.context_length, args.tp_size,
                                 args.ep_size, args.execution, options, args.engine, args.ep_style,
                                 args.engine_release, args.speculation)
    if args.json:
        print(dumps_strict({**r.as_json(), "warnings": list(args.layout_warnings)}, indent=1))
    else:
        print(speculative_step.render(r))
    return 0


def rate_list(text: str) -> list[float]:
    rates = [hit_rate(x) for x in text.split(",") if x.strip()]
    if not rates:
        raise ValueError("empty rate list")
    return rates


@quiet_broken_pipe
def main(argv=None) -> int:
    p = ArgumentParser(prog="text-generate", description=__doc__.split("\n")[0])
    p.add_argument("model", help="bundled model name, folder or config.json path, or Hugging Face Hub id")
    add_device_arguments(p)
    add_speculation_arguments(p)
    p.add_argument("--num-queries", "-b", type=positive_int, default=1, help="sequences in the batch (default 1)")
    p.add_argument("--query-length", "-q", type=positive_int, default=None,
                   help="new tokens per sequence (default 2048 prefill, 1 decode)")
    p.add_argument("--context-length", "-c", type=int, default=None,
                   help=f"tokens already in the KV cache (default 0; context + query at most {MAX_TOKENS.default:,}, "
                        f"raised with {MAX_TOKENS.env})")
    p.add_argument("--decode", action="store_true", help="one decode step over the context")
    p.add_argument("--output-length", "-n", type=positive_int, default=None, metavar="N",
                   help="serve the -b requests of -q prompt tokens to N output tokens each: TTFT, TPOT, end-to-end "
                        "latency and tokens/s of the batch, as `vllm bench latency` reports them")
    p.add_argument("--max-prefill-tokens", type=positive_int, default=None,
                   help="with --output-length: tokens per engine step (the chunked-prefill budget; default: the "
                        "engine's)")
    p.add_argument("--no-chunked-prefill", dest="chunked_prefill", action="store_false", default=True,
                   help="with --output-length: whole prompts per step, prefill and decode steps apart (vLLM's V0 "
                        "scheduler, e.g. V0 on ROCm)")
    p.add_argument("--max-running", type=positive_int, default=None,
                   help="with --output-length: requests running at once (max_num_seqs; default: the engine's)")
    hits = p.add_mutually_exclusive_group()   # the sweep gives every rate itself
    hits.add_argument("--prefix-cache-hit-rate", type=hit_rate, default=0.0,
                      help="fraction of query tokens found in the prefix cache, in [0, 1) (default 0.0)")
    hits.add_argument("--sweep-prefix-cache-hit-rate", type=rate_list, default=None, metavar="R1,R2,...",
                      help=f"prefill TTFT for each hit rate, with the speedup over rate 0 (at most "
                           f"{MAX_SWEEP.default} rates, raised with {MAX_SWEEP.env})")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="with the sweep: draw TTFT vs hit rate")
    p.add_argument("--tp-size", type=positive_int, default=1, help="tensor-parallel degree (default 1)")
    p.add_argument("--ep-size", type=positive_int, default=1, help="expert-parallel degree for MoE (default 1)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    add_model_arguments(p)
    args = p.parse_args(argv)
    args.context_given = args.context_length is not None
    args.context_length = args.context_length or 0
    if args.query_length is None:
        args.query_length = 1 if args.decode else 2048
    if args.context_length < 0:
        p.error(f"--context-length must be >= 0, got {args.context_length}")
    return run_main(body, args)


if __name__ == "__main__":
    sys.exit(main())
