"""throughput_optimizer's flags: the parsers of their values, and the checks that refuse a search before it runs."""
from __future__ import annotations

import math

from serving.search import MIXED

from ..common import (MAX_BATCH_TOKENS, MAX_DEVICES, MAX_REQUESTS, MAX_RUNNING, MAX_TOKENS, check_capacity_scheduler,
                      check_plot_path, positive_int, warn)
from .config import InputError


def count_devices(args, hw) -> int:
    if args.nodes is None:
        if args.num_devices is None:
            raise InputError("give --num-devices N (or --nodes K for K whole nodes)")
        MAX_DEVICES.check(args.num_devices, "--num-devices")
        return args.num_devices
    per_node = hw.gpus_per_node
    n = args.num_devices or args.nodes * per_node
    MAX_DEVICES.check(n, "--nodes x GPUs per node" if args.num_devices is None else "--num-devices")
    if n > args.nodes * per_node or n <= (args.nodes - 1) * per_node:
        raise InputError(f"--num-devices {n} does not fill --nodes {args.nodes} of {per_node} GPUs ({hw.name})")
    if args.nodes > 1 and hw.scale_out_bandwidth_gbps <= 0:
        raise InputError(f"{hw.name}: the profile has no scale-out network ('scale_out'), so layouts over "
                         f"{args.nodes} nodes cannot be priced")
    return n


def check_flags(args) -> None:
    """Flags that are wrong whatever the model: refused before anything is fetched or traced."""
    check_plot_path(args.plot)
    if args.input_length is not None and args.output_length is not None:   # a request's KV: prompt + answer
        MAX_TOKENS.check(args.input_length + args.output_length, "--input-length + --output-length")
    for flag, value in (("--num-requests", args.num_requests), ("--concurrency", args.concurrency)):
        if value is not None:   # 10^15 users is a typo; its answer (a queue of centuries) is no serving setup
            MAX_REQUESTS.check(value, flag)
    if args.max_num_seqs is not None:
        MAX_RUNNING.check(args.max_num_seqs, "--max-num-seqs")
    if args.max_prefill_tokens is not None:
        MAX_BATCH_TOKENS.check(args.max_prefill_tokens, "--max-prefill-tokens")
    if args.prefix_cache_block_size > 1:
        MAX_TOKENS.check(args.prefix_cache_block_size, "--prefix-cache-block-size")
    check_capacity_scheduler(args)


MAX_LOGGED_KV_TOKENS = 10**9   # a petabyte-scale cache at ~1 MB a token: no server logs more


def check_logged_capacity(args, plan: list, speculating: bool) -> None:
    """--kv-cache-tokens is what one engine copy logged: it prices one layout (DP replicas alike), in mixed
    mode; with --speculative it is the speculating server's, and the plain baseline keeps the estimate."""
    if args.kv_cache_tokens is None:
        return
    if args.kv_cache_tokens > MAX_LOGGED_KV_TOKENS:
        raise InputError(f"--kv-cache-tokens {args.kv_cache_tokens:,}: over {MAX_LOGGED_KV_TOKENS:,} tokens per "
                         f"replica, beyond any server's cache")
    if args.mode != MIXED:
        raise InputError("--kv-cache-tokens is one server's logged capacity: use --mode mixed (disaggregated pools "
                         "hold other caches)")
    shapes = {(lay.tp, lay.pp, lay.ep, lay.attention_dp) for lay in plan}
    if len(shapes) > 1:
        raise InputError(f"--kv-cache-tokens is the capacity one layout logged, and {len(shapes)} layouts are "
                         f"searched: pin one with --tp-sizes, --pp-sizes, --ep-sizes and --attention-dp")
    if speculating:
        warn(f"--kv-cache-tokens {args.kv_cache_tokens}: the speculative setups are priced at it, the plain "
             f"baseline at tracecost's own estimate (its server holds no draft)")


def int_list(text: str) -> list[int]:
    return [positive_int(x) for x in text.split(",") if x.strip()]


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"must be a number, got '{text}'") from None
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"must be a finite number > 0, got {text}")
    return value


MAX_TOP = 1000   # a typo guard, as the work limits are: --top 10^9 was taken silently


def top_count(text: str) -> int:
    value = positive_int(text)
    if value > MAX_TOP:
        raise ValueError(f"must be <= {MAX_TOP}, got {text}")
    return value


def headroom_share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"must be a number, got '{text}'") from None
    if not (0 <= value < 1):
        raise ValueError(f"must be in [0, 1), got {text}")
    return value


def memory_fraction(text: str) -> float:
    value = positive_float(text)
    if value > 1:
        raise ValueError(f"must be in (0, 1], got {text}")
    return value
