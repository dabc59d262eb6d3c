"""Argument parsing and error handling shared by the inference commands."""
from __future__ import annotations

import argparse
import sys

from cost.engines import DEFAULT_ENGINE, ENGINES
from cost.execution import EP_ALL_TOKENS, EP_STYLES, EXECUTIONS
from cost.profile import ProfileError
from tracer.__main__ import ArgumentParser, add_model_arguments, model_spec, trace_options
from tracer.model_source import ModelError

from serving.workload import WorkloadError

from .inference.config import InputError

USER_ERRORS = (InputError, ModelError, ProfileError, WorkloadError, ValueError)

__all__ = ["ArgumentParser", "USER_ERRORS", "add_device_arguments", "add_model_arguments", "hit_rate", "model_spec",
           "positive_int", "run_main", "trace_options", "warn"]


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
        raise argparse.ArgumentTypeError(f"must be an integer, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def add_device_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", required=True, help="hardware profile name/alias (python -m hw_profiles) or .json path")
    p.add_argument("--execution", default="engine", choices=EXECUTIONS,
                   help="engine: a serving engine's kernels (default); eager: HF transformers, unfused")
    p.add_argument("--engine", default=DEFAULT_ENGINE, choices=list(ENGINES),
                   help=f"serving engine whose fitted kernel models price the step (default {DEFAULT_ENGINE})")
    p.add_argument("--ep-style", default=EP_ALL_TOKENS, choices=EP_STYLES,
                   help="expert parallelism: all-tokens (vLLM's default: every rank routes every token, partial "
                        "outputs all-reduced) or dispatch (DeepEP-style all-to-all to the experts' ranks)")


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def run_main(body, args) -> int:
    """Run a command body; user errors become one line on stderr and exit code 2, never a traceback."""
    try:
        return body(args)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
