"""Best serving setup (parallel layout and batch) for a model on N devices, within TTFT / TPOT limits.

    python -m cli.inference.throughput_optimizer MODEL --device DEVICE --num-devices N --input-length I
        --output-length O [--prefix-cache-hit-rate H] [--ttft-limit MS] [--tpot-limit MS]
        [--max-prefill-tokens T] [--mode mixed|disagg|both] [--json]

Definitions (README, "throughput_optimizer"): per replica of `tp` devices with `batch` concurrent requests,
mixed (PD co-located) mode interleaves prefill waves of prefill_batch_size requests with decode steps:
  cycle  = O x decode_step(batch) + ceil(batch / wave) x prefill_wave
  TTFT   = (waves + 1) / 2 x (prefill_wave + decode_step(batch)),  waves = ceil(batch / wave)
  TPOT   = cycle / O                                (includes the other requests' prefill waves)
  tokens/s = dp x batch x O / cycle
Disaggregated mode runs prefill and decode on separate instances and balances their rates.
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field, replace

from cost.estimate import Parallelism, estimate
from cost.profile import HardwareProfile, load_profile
from tracer.model_source import ModelSpec, resolve_model
from tracer.table import format_table
from tracer.trace import trace
from tracer.work import Request, TraceOptions

from ..common import (ArgumentParser, add_device_arguments, add_model_arguments, hit_rate, positive_int, run_main,
                      trace_options)
from .memory import GB, MemoryEstimate, estimate_memory
from .shapes import ServingShapes, load_hit_rate_distribution

MEMORY_UTILIZATION = 0.9  # share of device memory a serving engine plans for (vLLM's default)
MIXED, DISAGG = "mixed", "disagg"


@dataclass
class Candidate:
    mode: str
    tp_size: int
    ep_size: int
    dp_size: int
    batch_size: int
    prefill_batch_size: int
    ttft_ms: float
    tpot_ms: float
    throughput_tokens_per_s: float
    throughput_tokens_per_s_per_device: float
    memory: MemoryEstimate
    fits: bool
    meets_limits: bool
    why_not: list[str] = field(default_factory=list)
    prefill_instances: int | None = None
    decode_instances: int | None = None
    prefill_to_decode_ratio: float | None = None  # prefill instances per decode instance that balance the rates

    def as_json(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k not in ("memory", "why_not")}
        out["memory_gb"] = self.memory.as_gb()
        out["why_not"] = self.why_not
        if self.mode == MIXED:
            for key in ("prefill_instances", "decode_instances", "prefill_to_decode_ratio"):
                out.pop(key)
        return out


@dataclass(frozen=True)
class Limits:
    ttft_ms: float | None = None
    tpot_ms: float | None = None


class Evaluator:
    """Prices candidates; every distinct forward shape is traced once and costed per layout."""

    def __init__(self, spec: ModelSpec, hw: HardwareProfile, shapes: ServingShapes, options: TraceOptions,
                 execution: str, limits: Limits, num_devices: int, engine: str = "vllm", ep_style: str = "all-tokens"):
        self.spec, self.hw, self.shapes, self.options = spec, hw, shapes, options
        self.execution, self.limits, self.num_devices = execution, limits, num_devices
        self.engine, self.ep_style = engine, ep_style
        self._latency: dict = {}
        self.hit_rate_mix: list[tuple[float, float]] | None = None

    def latency_s(self, request: Request, tp: int, ep: int) -> float:
        key = (request, tp, ep)
        if key not in self._latency:
            t = trace(self.spec, request, self.options)
            par = Parallelism(tp, ep, self.ep_style)
            self._latency[key] = estimate(t, self.hw, self.execution, par, self.engine).wall_s
        return self._latency[key]

    def wave_s(self, batch: int, tp: int, ep: int) -> float:
        """One prefill wave; with a hit-rate distribution, the mean over its rates."""
        mix = self.hit_rate_mix or [(self.shapes.prefix_cache_hit_rate, 1.0)]
        total = 0.0
        for rate, weight in mix:
            shapes = replace(self.shapes, prefix_cache_hit_rate=rate)
            total += weight * sum(self.latency_s(r, tp, ep) for r in shapes.prefill_requests(batch))
        return total

    def memory(self, kv_tokens: int, activation_requests: list[Request], tp: int, ep: int,
               sequences: int) -> MemoryEstimate:
        estimates = [estimate_memory(trace(self.spec, r, self.options), kv_tokens, tp, ep, self.hw.memory_capacity_gb,
                                     sequences=sequences) for r in activation_requests]
        return max(estimates, key=lambda m: m.total)

    def _check(self, ttft_s: float, tpot_s: float, memory: MemoryEstimate) -> tuple[bool, bool, list[str]]:
        why = []
        fits = memory.total <= memory.capacity * MEMORY_UTILIZATION
        if not fits:
            why.append(f"memory {memory.total / GB:.1f} GB > {memory.capacity * MEMORY_UTILIZATION / GB:.1f} GB usable")
        if self.limits.ttft_ms is not None and ttft_s * 1e3 > self.limits.ttft_ms:
            why.append(f"TTFT {ttft_s * 1e3:.1f} ms > {self.limits.ttft_ms:g} ms")
        if self.limits.tpot_ms is not None and tpot_s * 1e3 > self.limits.tpot_ms:
            why.append(f"TPOT {tpot_s * 1e3:.2f} ms > {self.limits.tpot_ms:g} ms")
        return fits, not why, why

    def mixed(self, tp: int, ep: int, batch: int) -> Candidate:
        s = self.shapes
        dp = self.num_devices // tp
        wave = min(s.prefill_batch_size, batch)
        wave_s = self.wave_s(wave, tp, ep)
        decode = s.decode_request(batch)
        step_s = self.latency_s(decode, tp, ep)
        waves = math.ceil(batch / wave)
        cycle_s = s.output_length * step_s + waves * wave_s
        # the batch's new requests are prefilled in `waves` waves, each followed by a decode step: on average a
        # request's first token comes after half of them
        ttft_s, tpot_s = (waves + 1) / 2 * (wave_s + step_s), cycle_s / s.output_length
        memory = self.memory(batch * s.kv_tokens_per_request, s.prefill_requests(wave) + [decode], tp, ep, batch)
        fits, ok, why = self._check(ttft_s, tpot_s, memory)
        throughput = dp * batch * s.output_length / cycle_s
        return Candidate(MIXED, tp, ep, dp, batch, wave, ttft_s * 1e3, tpot_s * 1e3, throughput,
                         throughput / self.num_devices, memory, fits, ok, why)

    def disagg(self, tp: int, ep: int, batch: int) -> Candidate:
        s = self.shapes
        replicas = self.num_devices // tp
        wave = s.prefill_batch_size
        wave_s = self.wave_s(wave, tp, ep)
        # the prefill instance ships each request's KV cache to a decode instance
        kv_bytes = trace(self.spec, s.prefill_requests(1)[0], self.options).kv_bytes_per_token * s.input_length
        transfer_s = kv_bytes / (self.hw.interconnect_bandwidth_gbps * 1e9)
        decode = s.decode_request(batch)  # decode instances ignore the prefix cache entirely
        step_s = self.latency_s(decode, tp, ep)
        prefill_rate = wave / wave_s                          # requests/s per prefill instance
        decode_rate = batch / (s.output_length * step_s)      # requests/s per decode instance
        best_p = max(range(1, replicas), key=lambda p: min(p * prefill_rate, (replicas - p) * decode_rate),
                     default=0)
        requests_per_s = min(best_p * prefill_rate, (replicas - best_p) * decode_rate) if best_p else 0.0
        memory = max(self.memory(batch * s.kv_tokens_per_request, [decode], tp, ep, batch),
                     self.memory(wave * s.input_length, s.prefill_requests(wave), tp, ep, wave), key=lambda m: m.total)
        ttft_s, tpot_s = wave_s + transfer_s, step_s
        fits, ok, why = self._check(ttft_s, tpot_s, memory)
        if replicas < 2:
            ok = False
            why.append(f"disaggregation needs 2 instances; {self.num_devices} devices hold {replicas} of TP {tp}")
        throughput = requests_per_s * s.output_length
        return Candidate(DISAGG, tp, ep, replicas, batch, wave, ttft_s * 1e3, tpot_s * 1e3, throughput,
                         throughput / self.num_devices, memory, fits, ok, why, best_p, replicas - best_p,
                         decode_rate / prefill_rate)


def batch_grid(low: int, high: int) -> list[int]:
    """1, 2, 3, 4, 6, 8, 12, 16, ...: powers of two and their midpoints, within [low, high]."""
    grid, p = {low, high}, 1
    while p <= high:
        grid.update(x for x in (p, p + p // 2) if low <= x <= high)
        p *= 2
    return sorted(grid)


def search_layout(evaluate, grid: list[int]) -> list[Candidate]:
    """Largest feasible batch by doubling then bisection over the grid (feasibility falls as batch grows)."""
    seen: dict[int, Candidate] = {}

    def feasible(i: int) -> bool:
        if grid[i] not in seen:
            seen[grid[i]] = evaluate(grid[i])
        return seen[grid[i]].meets_limits

    if not feasible(0):
        return list(seen.values())
    good, step = 0, 1
    while good + step < len(grid) and feasible(good + step):
        good += step
        step *= 2
    bad = min(good + step, len(grid))
    while bad - good > 1:
        mid = (good + bad) // 2
        if feasible(mid):
            good = mid
        else:
            bad = mid
    return list(seen.values())


def layouts(num_devices: int, tp_sizes: list[int] | None, is_moe: bool) -> list[tuple[int, int]]:
    tps = tp_sizes or [t for t in (1, 2, 4, 8, 16, 32, 64) if t <= num_devices and num_devices % t == 0]
    out = [(tp, 1) for tp in tps]
    if is_moe:
        out += [(tp, tp) for tp in tps if tp > 1]
    return out


def optimize(args) -> dict:
    spec = resolve_model(args.model)
    hw = load_profile(args.device)
    mix = load_hit_rate_distribution(args.prefix_cache_hit_rate_distribution) \
        if args.prefix_cache_hit_rate_distribution else None
    # with a distribution, wave capacity follows the mean rate; each wave's time averages over the rates
    rate = sum(r * w for r, w in mix) if mix else args.prefix_cache_hit_rate
    shapes = ServingShapes(args.input_length, args.output_length, rate, args.max_prefill_tokens,
                           args.prefix_cache_block_size)
    options = trace_options(args)
    for tp in args.tp_sizes or []:
        if args.num_devices % tp:
            raise ValueError(f"--tp-sizes: {tp} does not divide --num-devices {args.num_devices}")
    evaluator = Evaluator(spec, hw, shapes, options, args.execution, Limits(args.ttft_limit, args.tpot_limit),
                          args.num_devices, args.engine, args.ep_style)
    evaluator.hit_rate_mix = mix
    is_moe = any(op.experts is not None for op in trace(spec, Request(1, 1, 1, decode=True), options).ops)
    modes = [MIXED, DISAGG] if args.mode == "both" else [args.mode]
    plan = [(mode, tp, ep) for mode in modes for tp, ep in layouts(args.num_devices, args.tp_sizes, is_moe)]
    grid = batch_grid(*args.batch_range)
    candidates: list[Candidate] = []
    for i, (mode, tp, ep) in enumerate(plan):
        progress(i, len(plan), f"{mode} TP={tp}" + (f" EP={ep}" if ep > 1 else ""))
        method = evaluator.mixed if mode == MIXED else evaluator.disagg
        candidates += search_layout(lambda b, m=method, t=tp, e=ep: m(t, e, b), grid)
    progress(len(plan), len(plan), "done")
    feasible = sorted((c for c in candidates if c.meets_limits), key=lambda c: -c.throughput_tokens_per_s)
    ranked = feasible + sorted((c for c in candidates if not c.meets_limits), key=lambda c: -c.throughput_tokens_per_s)
    result = {
        "model": spec.name, "device": hw.name, "num_devices": args.num_devices, "mode": args.mode,
        "execution": args.execution, "engine": args.engine if args.execution == "engine" else None,
        "input_length": shapes.input_length, "output_length": shapes.output_length,
        "prefix_cache_hit_rate": shapes.prefix_cache_hit_rate, "cached_prefix_tokens": shapes.cached_prefix_tokens,
        "effective_input_length": shapes.effective_input_length, "max_prefill_tokens": shapes.max_prefill_tokens,
        "prefill_chunked": shapes.chunked, "prefix_cache_block_size": shapes.prefix_cache_block_size,
        "hit_rate_distribution": [{"rate": r, "weight": w} for r, w in mix] if mix else None,
        "limits": {"ttft_ms": args.ttft_limit, "tpot_ms": args.tpot_limit},
        "best": feasible[0].as_json() if feasible else {},
        "candidates": [c.as_json() for c in ranked[:args.top]],
        "evaluated": len(candidates),
    }
    if not feasible:
        reasons = sorted({w.split(" ")[0] for c in candidates for w in c.why_not})
        result["why_no_feasible_layout"] = (f"every layout fails on: {', '.join(reasons)}" if reasons
                                            else "no layout evaluated")
    return result


def progress(done: int, total: int, label: str) -> None:
    if not sys.stderr.isatty():
        return
    width = 30
    filled = width * done // max(1, total)
    print(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label:<24}", end="" if done < total else "\n",
          file=sys.stderr, flush=True)


def render(r: dict) -> str:
    head = (f"{r['model']} on {r['num_devices']} x {r['device']}, mode {r['mode']}: input {r['input_length']} "
            f"(cached prefix {r['cached_prefix_tokens']}, effective {r['effective_input_length']}"
            f"{', chunked' if r['prefill_chunked'] else ''}), output {r['output_length']}, "
            f"max prefill tokens {r['max_prefill_tokens']}")
    rows = []
    for c in r["candidates"]:
        split = f" P{c['prefill_instances']}:D{c['decode_instances']}" if c["mode"] == DISAGG else ""
        rows.append([c["mode"] + split, c["tp_size"], c["ep_size"], c["dp_size"], c["batch_size"],
                     c["prefill_batch_size"], f"{c['ttft_ms']:.1f}", f"{c['tpot_ms']:.2f}",
                     f"{c['throughput_tokens_per_s']:,.0f}", f"{c['throughput_tokens_per_s_per_device']:,.0f}",
                     f"{c['memory_gb']['total']:.1f}", "yes" if c["meets_limits"] else "; ".join(c["why_not"])])
    table = format_table(["mode", "TP", "EP", "DP", "batch", "wave", "TTFT ms", "TPOT ms", "tokens/s",
                          "tokens/s/dev", "mem GB", "meets limits"], rows)
    if r["best"]:
        b = r["best"]
        tail = (f"best: {b['mode']} TP={b['tp_size']} EP={b['ep_size']} DP={b['dp_size']} batch={b['batch_size']}: "
                f"{b['throughput_tokens_per_s']:,.0f} output tokens/s ({b['throughput_tokens_per_s_per_device']:,.0f} "
                f"per device), TTFT {b['ttft_ms']:.1f} ms, TPOT {b['tpot_ms']:.2f} ms")
    else:
        tail = f"no feasible layout: {r['why_no_feasible_layout']}"
    return f"{head}\n\n{table}\n\n{tail}"


def body(args) -> int:
    result = optimize(args)
    print(json.dumps(result, indent=1) if args.json else render(result))
    return 0


def tp_list(text: str) -> list[int]:
    return [positive_int(x) for x in text.split(",") if x.strip()]


def main(argv=None) -> int:
    p = ArgumentParser(prog="throughput-optimizer", description=__doc__.split("\n")[0])
    p.add_argument("model", help="bundled model name, folder or config.json path, or HF id in the local cache")
    add_device_arguments(p)
    p.add_argument("--num-devices", type=positive_int, required=True)
    p.add_argument("--input-length", type=positive_int, required=True, help="prompt tokens per request")
    p.add_argument("--output-length", type=positive_int, required=True, help="generated tokens per request")
    p.add_argument("--prefix-cache-hit-rate", type=hit_rate, default=0.0,
                   help="fraction of input tokens found in the prefix cache, in [0, 1) (default 0.0)")
    p.add_argument("--prefix-cache-block-size", type=positive_int, default=1,
                   help="count cache hits in whole blocks of this many tokens (default 1: token granularity)")
    p.add_argument("--prefix-cache-hit-rate-distribution", default=None, metavar="FILE",
                   help="per-request hit rates (JSON list or one per line) instead of one rate")
    p.add_argument("--ttft-limit", type=float, default=None, metavar="MS")
    p.add_argument("--tpot-limit", type=float, default=None, metavar="MS")
    p.add_argument("--max-prefill-tokens", type=positive_int, default=8192,
                   help="token budget of one prefill wave (default 8192)")
    p.add_argument("--mode", default=MIXED, choices=[MIXED, DISAGG, "both"],
                   help="mixed: prefill and decode on the same instances (PD co-located); disagg: separate")
    p.add_argument("--tp-sizes", type=tp_list, default=None, help="comma list (default: powers of 2 dividing N)")
    p.add_argument("--batch-range", type=positive_int, nargs=2, default=[1, 1024], metavar=("MIN", "MAX"))
    p.add_argument("--top", type=positive_int, default=10, help="candidates to show (default 10)")
    p.add_argument("--json", action="store_true")
    add_model_arguments(p)
    args = p.parse_args(argv)
    if args.batch_range[0] > args.batch_range[1]:
        p.error("--batch-range MIN must be <= MAX")
    for name in ("ttft_limit", "tpot_limit"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    return run_main(body, args)


if __name__ == "__main__":
    sys.exit(main())
