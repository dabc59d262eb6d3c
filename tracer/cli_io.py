"""Input and output plumbing every command shares: JSON-lines input, strict JSON, and a quiet exit when the reader
closes the pipe.

    print(dumps_strict(result, indent=1))   # no NaN/Infinity: +inf (an unlimited value) becomes null
    @quiet_broken_pipe
    def main(argv=None) -> int: ...         # `python -m X | head` ends without a traceback
"""
from __future__ import annotations

import functools
import json
import math
import os
import sys

SIGPIPE_EXIT = 141   # what a shell reports for a writer killed by SIGPIPE (128 + 13)


def json_lines(lines, where: str | None, error: type[Exception]):
    """(line number, object) for each non-blank line of a JSON-lines text; a line that is not JSON raises `error`
    naming it (`where:N`, or `line N` when there is no file name)."""
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise error(f"{f'{where}:{n}' if where else f'line {n}'}: not JSON ({e.msg})") from None
        yield n, obj


class NonFiniteError(ValueError):
    """A NaN or -inf reached the output: a bug upstream, reported instead of printed as a number."""


def strict(value, path: str = "$"):
    """A copy of `value` that strict JSON parsers accept: +inf (unlimited) -> None; NaN or -inf -> an error."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        if value == math.inf:
            return None
        raise NonFiniteError(f"internal error: {value} at {path} in the JSON output")
    if isinstance(value, dict):
        return {k: strict(v, f"{path}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):   # numpy scalars
        return strict(value.item(), path)
    return value


def dumps_strict(value, **kwargs) -> str:
    """json.dumps that never writes NaN or Infinity (RFC 8259)."""
    return json.dumps(strict(value), allow_nan=False, **kwargs)


def quiet_broken_pipe(main):
    """Wrap a CLI main: a reader that stops early (| head) ends the command quietly with exit 141."""
    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            code = main(*args, **kwargs)
            sys.stdout.flush()
            return code
        except BrokenPipeError:
            # stdout is gone: point it at devnull so the interpreter's final flush does not complain
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
            except (OSError, ValueError):
                pass
            return SIGPIPE_EXIT
    return wrapper
