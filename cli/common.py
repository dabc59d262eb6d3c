"""Argument parsing and error handling shared by the inference commands."""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from cost.engine_kernels.common import release_series
from cost.engines import DEFAULT_ENGINE, ENGINES, engine_releases, parse_engine
from cost.execution import ENGINE, EP_ALL_TOKENS, EP_STYLES, EXECUTIONS
from cost.layout_checks import Layout, LayoutError, LayoutReport, ModelFacts, check_layout
from cost.profile import HardwareProfile, ProfileError, engine_kernel_releases, load_profile
from tracer.cli_io import dumps_strict, quiet_broken_pipe
from tracer.__main__ import ArgumentParser, add_model_arguments, model_spec, trace_options
from tracer.model_source import ModelError

from serving.capacity import CAPACITY_SCHEDULERS
from serving.speculative import METHODS as SPECULATIVE_METHODS, Speculation, parse_speculation
from serving.workload import WorkloadError

from .inference.config import InputError

USER_ERRORS = (InputError, LayoutError, ModelError, ProfileError, WorkloadError, ValueError)

__all__ = ["ArgumentParser", "USER_ERRORS", "WorkLimit", "add_device_arguments", "add_model_arguments",
           "check_layout_or_fail", "check_plot_path", "dumps_strict", "finite_float", "hit_rate", "limit_ms",
           "load_device", "model_spec", "origin_notes", "positive_int", "quiet_broken_pipe", "run_main",
           "speculations", "add_speculation_arguments", "trace_options", "warn"]


class WorkLimit:
    """A bound on the work one command may start, raised with an environment variable.

    Limits exist so that a typo (10^12 tokens, a budget of 1 token per step) is refused at once instead
    of running for hours or exhausting memory; they sit far above any real model or trace."""

    def __init__(self, env: str, default: int, what: str):
        self.env, self.default, self.what = env, default, what

    @property
    def value(self) -> int:
        text = os.environ.get(self.env)
        if not text:
            return self.default
        try:
            return max(1, int(float(text)))
        except (ValueError, OverflowError):
            raise InputError(f"{self.env} must be a number, got '{text}'") from None

    def check(self, amount: float, label: str) -> None:
        if amount > self.value:
            raise InputError(f"{label} is {amount:,.0f}, over the limit of {self.value:,} {self.what}; "
                             f"set {self.env}={int(amount)} to allow it")


MAX_TOKENS = WorkLimit("TRACECOST_MAX_TOKENS", 10**7, "tokens per sequence (query + context)")
MAX_BATCH_TOKENS = WorkLimit("TRACECOST_MAX_BATCH_TOKENS", 10**9, "tokens in one step (batch x sequence)")
MAX_SWEEP = WorkLimit("TRACECOST_MAX_SWEEP", 256, "points in one sweep")
MAX_REQUESTS = WorkLimit("TRACECOST_MAX_REQUESTS", 10**6, "requests in one simulation")
MAX_SIM_TOKENS = WorkLimit("TRACECOST_MAX_SIM_TOKENS", 5 * 10**8, "tokens (prompt + output) in one simulation")
MAX_SIM_STEPS = WorkLimit("TRACECOST_MAX_SIM_STEPS", 5 * 10**5, "engine steps in one simulation (estimated)")
# the largest GPU clusters hold ~10^5 GPUs; one model's deployment searched over 10^7 of them is a typo (and its
# disaggregated pool splits are one pricing each)
MAX_DEVICES = WorkLimit("TRACECOST_MAX_DEVICES", 65536, "GPUs in one deployment")
MAX_RUNNING = WorkLimit("TRACECOST_MAX_RUNNING", 1 << 20, "requests running at once in one engine instance")


def finite_float(low: float | None = None, high: float | None = None, *, low_open: bool = False):
    """argparse type: a finite number in [low, high] ((low, high] with low_open)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got '{text}'") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if low is not None and (value <= low if low_open else value < low):
            raise argparse.ArgumentTypeError(f"must be {'>' if low_open else '>='} {low:g}, got {text}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be <= {high:g}, got {text}")
        return value
    return parse


def check_plot_path(path: str | None) -> None:
    """--plot must name a writable file in an existing folder: checked before any work is done."""
    if path is None:
        return
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise InputError(f"--plot {path}: folder {folder} does not exist")
    if target.is_dir():
        raise InputError(f"--plot {path} is a folder; give a file name such as plot.png")
    if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise InputError(f"--plot {path}: not writable")
    # matplotlib appends .png to a name without an extension: the file written would not be the one named
    extension = target.suffix[1:].lower()
    if not extension:
        raise InputError(f"--plot {path} has no extension to name the format; give e.g. {target.name.rstrip('.')}.png")
    formats = _plot_formats()
    if formats and extension not in formats:
        raise InputError(f"--plot {path}: .{extension} is not a format matplotlib writes ({', '.join(formats)})")


def _plot_formats() -> list[str]:
    """The extensions the installed matplotlib's savefig writes; [] without matplotlib (no plot is written)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return []
    return sorted(Figure().canvas.get_supported_filetypes())


def check_layout_or_fail(config: dict, name: str, layout: Layout, input_length: int | None = None,
                         moe_imbalance: float | None = None, ep_style: str | None = None) -> LayoutReport:
    """The layout checked against the model: errors raise LayoutError (exit 2), warnings go to stderr and are
    returned for the --json output."""
    report = check_layout(ModelFacts.from_config(config, name), layout, input_length, moe_imbalance, ep_style)
    report.raise_errors()
    for message in report.warnings:
        warn(message)
    return report


def limit_ms(text: str) -> float | None:
    """argparse type for a latency limit in ms: a number > 0; inf means no limit (None)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of ms (or inf: no limit), got '{text}'") from None
    if value == math.inf:
        return None
    if not value > 0:   # also NaN and -inf
        raise argparse.ArgumentTypeError(f"must be a number of ms > 0 (or inf: no limit), got {text}")
    return value


def hit_rate(text: str) -> float:
    """argparse type for --prefix-cache-hit-rate: a float in [0, 1) (RFC 4.1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1), got '{text}'") from None
    if not (0.0 <= value < 1.0):
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        try:   # 1e6 is a common way to write a count; 1.5 is not a count
            number = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got '{text}'") from None
        if not math.isfinite(number) or number != int(number):
            raise argparse.ArgumentTypeError(f"must be an integer, got '{text}'") from None
        value = int(number)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    if value > 10**15:
        raise argparse.ArgumentTypeError(f"must be <= 10^15, got {text}")
    return value


class EngineAction(argparse.Action):
    """--engine NAME[==RELEASE]: stores the engine in `engine` and the release asked for in `engine_release`."""

    def __call__(self, parser, namespace, value, option_string=None):
        try:
            name, release = parse_engine(value)
            # a release without data is refused here, not priced: it needs end-to-end rows (its overheads) or
            # kernel tables (its kernels, at the nearest release's overheads)
            if release is not None and release not in engine_releases(name) \
                    and release_series(release) not in engine_kernel_releases(name):
                raise ValueError(f"no {ENGINES[name].label} {release} data (end-to-end rows: "
                                 f"{', '.join(engine_releases(name)) or 'none'}; kernel tables of older releases: "
                                 f"{', '.join(engine_kernel_releases(name)) or 'none'})")
        except ValueError as e:
            parser.error(f"argument --engine: {e}")
        namespace.engine, namespace.engine_release = name, release


def add_device_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", required=True,
                   help="hardware profile name/alias (python -m hw_profiles) or .json path; NAME:TOPOLOGY for another "
                        "way of joining its GPUs (h100:hgx4), NAME@WATTSW for a board power cap (h200@500W)")
    p.add_argument("--execution", default="engine", choices=EXECUTIONS,
                   help="engine: a serving engine's kernels (default); eager: HF transformers, unfused")
    p.add_argument("--engine", default=DEFAULT_ENGINE, action=EngineAction, metavar="{" + ",".join(ENGINES) + "}[==R]",
                   help=f"serving engine whose fitted kernel models and overheads price the step (default "
                        f"{DEFAULT_ENGINE}); ENGINE==RELEASE (trtllm==0.17) picks an older release with "
                        f"end-to-end data or kernel tables, ENGINE alone the newest")
    p.set_defaults(engine_release=None)
    p.add_argument("--ep-style", default=EP_ALL_TOKENS, choices=EP_STYLES,
                   help="expert parallelism: all-tokens (vLLM's default: every rank routes every token, partial "
                        "outputs all-reduced) or dispatch (DeepEP-style all-to-all to the experts' ranks)")


def add_streaming_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True,
                   help="clients stream their tokens, as chat clients, `vllm bench serve` and MLPerf Server do "
                        "(default); --no-stream: each request's tokens come back with its completion. Streaming "
                        "costs an engine a response per running request per step (TensorRT-LLM's fitted "
                        "stream_us; vLLM's and SGLang's per-request terms were fitted on streaming runs)")


def add_endpoint_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--endpoint", choices=("chat", "completions"), default="chat",
                   help="what the clients post to the engine's HTTP server: chat completions (default), each rendered "
                        "from the model's chat template in the server's one process (vLLM parses the template per "
                        "request: its fitted chat_template_ms), or completions of a ready prompt")


def add_capacity_scheduler_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--capacity-scheduler", default=None, choices=CAPACITY_SCHEDULERS["trtllm"],
                   help="TensorRT-LLM's KV admission policy (default guaranteed_no_evict: a request is admitted "
                        "with its whole output's blocks, and nobody is preempted; max_utilization admits what fits "
                        "now, as vLLM does)")


def check_capacity_scheduler(args) -> None:
    if args.capacity_scheduler and args.capacity_scheduler not in CAPACITY_SCHEDULERS.get(args.engine, ()):
        raise InputError(f"--capacity-scheduler is TensorRT-LLM's; {args.engine} has one admission policy")


def add_speculation_arguments(p: argparse.ArgumentParser, several: bool = False) -> None:
    """`several`: the command searches lists of methods and of k (the optimizer), each beside no speculation."""
    g = p.add_argument_group("speculative decoding (serving/speculative.py)")
    g.add_argument("--speculative", metavar="|".join(SPECULATIVE_METHODS) + (",..." if several else ""), default=None,
                   help="draft method: the model's MTP layer, an EAGLE-3 head, a draft model, or n-gram lookup"
                        + (" (a list: each is searched)" if several else ""))
    g.add_argument("--num-speculative-tokens", metavar="K[,K...]" if several else "K", default="1",
                   help="tokens the draft proposes per step" + (" (a list: each is searched with every method, beside "
                                                                 "no speculation)" if several else "") + "; default 1")
    per_method = " (one value for every method, or one per method in --speculative's order, 'default' for a " \
                 "method's own)" if several else ""
    g.add_argument("--acceptance-rate", default=None, metavar="A[,A...]" if several else "A",
                   help="probability each proposed token is accepted, given the ones before (default: the "
                        "method's published default, named in the output)" + per_method)
    g.add_argument("--acceptance-length", default=None, metavar="L[,L...]" if several else "L",
                   help="mean tokens per step, the target's own included, as engines report it" + per_method)
    g.add_argument("--speculative-eagle-topk", type=int, default=1, metavar="B",
                   help="candidates per node of a tree draft, as SGLang's flag (default 1: a chain)")
    g.add_argument("--speculative-num-draft-tokens", type=int, default=None, metavar="N",
                   help="with a tree: tokens the target verifies per request, the last verified one included "
                        "(SGLang's flag)")


def _per_method(text: str | None, flag: str, methods: list[str]) -> list[float | None]:
    """--acceptance-rate or --acceptance-length as one number per method: one value for all, or one each ('default':
    the method's own)."""
    if text is None:
        return [None] * len(methods)
    parts = [t.strip() for t in str(text).split(",")]
    if len(parts) == 1:
        parts *= len(methods)
    if len(parts) != len(methods):
        raise InputError(f"{flag}: {len(parts)} values for {len(methods)} methods ({', '.join(methods)}): give one "
                         f"for all, or one per method ('default' for a method's own)")
    out: list[float | None] = []
    for t in parts:
        if t.lower() == "default":
            out.append(None)
            continue
        try:
            out.append(float(t))
        except ValueError:
            raise InputError(f"{flag}: '{t}' is not a number") from None
    return out


def speculations(args) -> list[Speculation]:
    """The speculative setups the arguments ask for (empty without --speculative): every method with every k."""
    given = [x for x in (args.acceptance_rate, args.acceptance_length, args.speculative_num_draft_tokens)
             if x is not None]
    if args.speculative is None:
        if given or args.num_speculative_tokens != "1" or args.speculative_eagle_topk != 1:
            raise InputError("--num-speculative-tokens, --acceptance-rate, --acceptance-length, "
                             "--speculative-eagle-topk and --speculative-num-draft-tokens need --speculative")
        return []
    methods = [m.strip() for m in str(args.speculative).split(",")]
    if len(set(m.lower() for m in methods)) != len(methods):
        raise InputError(f"--speculative lists a method twice: {args.speculative}")
    ks = []
    for text in str(args.num_speculative_tokens).split(","):
        try:
            ks.append(int(text))
        except ValueError:
            raise InputError(f"--num-speculative-tokens: '{text}' is not an integer") from None
    rates = _per_method(args.acceptance_rate, "--acceptance-rate", methods)
    lengths = _per_method(args.acceptance_length, "--acceptance-length", methods)
    return [parse_speculation(method, k, rate, length, args.speculative_eagle_topk, args.speculative_num_draft_tokens)
            for method, rate, length in zip(methods, rates, lengths) for k in ks]


def load_device(args) -> HardwareProfile:
    """--device's profile; an engine that does not run on it is refused here, before any tracing."""
    hw = load_profile(args.device)
    if args.execution == ENGINE:
        hw = hw.at_engine_release(args.engine_release)
        hw.engine(args.engine)
    return hw


def origin_notes(origin: dict) -> list[str]:
    """A result's `origin` JSON (cost/provenance.py Origin.as_json) as note lines: where its numbers come from."""
    out = [f"kernel numbers: {origin['kernels']}"]
    if origin.get("power_limit"):
        out.append(origin["power_limit"])
    if origin.get("overheads"):
        out.append(f"step overheads: {origin['overheads']}")
    return out


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def run_main(body, args) -> int:
    """Run a command body; user errors become one line on stderr and exit code 2, never a traceback."""
    try:
        return body(args)
    except BrokenPipeError:
        raise   # quiet_broken_pipe (around main) ends the command
    except OSError as e:   # a file the user named cannot be read or written
        print(f"error: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 2
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
