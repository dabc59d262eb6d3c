"""Per-request prompt and output lengths: a file of samples, a bundled quantile summary, or fixed lengths.

A LengthDistribution is a list of equally weighted (input, output) pairs: every request of a file, or, for a
bundled set (serving/data/length_sets.json), the product of its 64 input and 64 output quantiles (input and
output taken as independent; the summaries' correlations are small: -0.17 and 0.04). The steady-state model
(serving/steady_state.py) reads its means and its spread: prompt classes (a long prompt takes several
chunks), the KV a running request holds (a long output stays in the batch longer, so the running mix leans to
long outputs), and the longest outputs that end a finite run.

Files: CSV with a header, or JSONL with one object per request; the input column is one of input_length,
input_tokens, prompt_tokens, isl, input_len; the output column one of output_length, output_tokens,
completion_tokens, osl, output_len (the MLPerf per-sample summaries of openshift-psap/performance-dashboard,
mlperf-data/summaries/*.csv, are input_length,output_length).
"""
from __future__ import annotations

import csv
import json
import random
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

from tracer.cli_io import json_lines

INPUT_KEYS = ("input_length", "input_tokens", "prompt_tokens", "isl", "input_len")
OUTPUT_KEYS = ("output_length", "output_tokens", "completion_tokens", "osl", "output_len")
MAX_LENGTH = 10**8          # tokens of one request's prompt or output
MAX_ROWS = 10**7


class LengthsError(ValueError):
    """A bad lengths file; the message names the file and line."""


@dataclass(frozen=True)
class LengthDistribution:
    source: str                          # the file, or the bundled set's name
    requests: int                        # requests it describes (a summary's whole set)
    pairs: tuple[tuple[int, int], ...]   # equally weighted (input, output) token counts
    summarised: bool = False             # pairs are quantiles of a larger set, not its requests
    maxima: tuple[int, int] | None = None   # a summary's longest input and output (beyond its quantiles)

    def __post_init__(self):
        if not self.pairs:
            raise LengthsError(f"{self.source}: no requests")

    @property
    def mean_input(self) -> float:
        return sum(i for i, _ in self.pairs) / len(self.pairs)

    @property
    def mean_output(self) -> float:
        return sum(o for _, o in self.pairs) / len(self.pairs)

    def inputs(self) -> list[int]:
        return sorted(i for i, _ in self.pairs)

    def outputs(self) -> list[int]:
        return sorted(o for _, o in self.pairs)

    def longest(self, which: str) -> int:
        if self.maxima is not None:
            return self.maxima[0 if which == "input" else 1]
        return max(p[0 if which == "input" else 1] for p in self.pairs)

    def residence_mean(self, f) -> float:
        """Mean of f(input, output) over the requests running at a random moment: a request stays in the
        batch for its output's steps, so it counts in proportion to its output length."""
        weight = sum(o for _, o in self.pairs)
        return sum(o * f(i, o) for i, o in self.pairs) / weight

    def classes(self, which: str, count: int = 32) -> list[tuple[float, int]]:
        """(weight, length) classes of the inputs or outputs: every distinct length when there are at most
        `count`, else `count` equally weighted quantiles and the longest at one request's weight (the tail that
        sets a p99 or ends a burst)."""
        values = self.inputs() if which == "input" else self.outputs()
        n = len(values)
        if len(set(values)) <= count:
            out: dict[int, int] = {}
            for v in values:
                out[v] = out.get(v, 0) + 1
            return [(c / n, v) for v, c in sorted(out.items())]
        top = 1.0 / self.requests
        reps = [((1 - top) / count, values[min(n - 1, int((k + 0.5) / count * n))]) for k in range(count)]
        return reps + [(top, self.longest(which))]

    def stratified(self, n: int, seed: int = 0) -> list[tuple[int, int]]:
        """The expected sample of `n` requests, in an order the seed shuffles: the requests at the output quantiles
        (k - 1/3) / (n + 1/3), k = 1..n, where the k-th shortest of n random draws has its median (each with its
        own prompt), so its longest outputs are those half of all draws exceed rather than where one draw puts
        them (a burst ends with its longest outputs). n of n takes every request once."""
        order = sorted(self.pairs, key=lambda p: (p[1], p[0]))
        m = len(order)
        picked = [order[min(m - 1, int((k + 2 / 3) / (n + 1 / 3) * m))] for k in range(n)]
        random.Random(seed).shuffle(picked)
        return picked

    def scaled(self, output_mean: float, input_mean: float | None = None) -> LengthDistribution:
        """The same shape with outputs stretched to `output_mean` (a run whose model writes longer answers than
        the dataset's references: MLPerf Llama-2-70B runs average 291 output tokens, its reference outputs 219),
        and prompts to `input_mean` where given (a run whose tokenizer counts the same prompts otherwise)."""
        f = output_mean / self.mean_output
        g = 1.0 if input_mean is None else input_mean / self.mean_input
        pairs = tuple((max(1, round(i * g)), max(1, round(o * f))) for i, o in self.pairs)
        maxima = None if self.maxima is None else (max(1, round(self.maxima[0] * g)), max(1, round(self.maxima[1] * f)))
        how = f"outputs x{f:.3g}" + (f", prompts x{g:.3g}" if abs(g - 1) > 5e-4 else "")
        return LengthDistribution(f"{self.source}, {how}", self.requests, pairs, self.summarised, maxima)

    def describe(self) -> str:
        i, o = self.inputs(), self.outputs()
        kind = "requests" if not self.summarised else "requests (a 64-quantile summary)"
        return (f"lengths: {self.source}, {self.requests} {kind}, input mean {self.mean_input:.0f} p50 "
                f"{_median(i):.0f} max {self.longest('input')}, output mean {self.mean_output:.0f} p50 "
                f"{_median(o):.0f} max {self.longest('output')}")

    def as_json(self) -> dict:
        i, o = self.inputs(), self.outputs()
        return {"source": self.source, "requests": self.requests, "summarised": self.summarised,
                "input": {"mean": self.mean_input, "p50": _median(i), "max": self.longest("input")},
                "output": {"mean": self.mean_output, "p50": _median(o), "max": self.longest("output")}}


def fixed_lengths(input_tokens: int, output_tokens: int) -> str:
    return f"lengths: fixed {input_tokens}/{output_tokens}"


def _median(values: list[int]) -> float:
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2


@lru_cache(maxsize=1)
def bundled_sets() -> dict:
    data = json.loads((resources.files("serving") / "data" / "length_sets.json").read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


@lru_cache(maxsize=None)
def bundled(name: str) -> LengthDistribution:
    """A bundled set: every request of its pairs file, or the product of its input and output quantiles."""
    entry = bundled_sets()[name]
    if "pairs_file" in entry:
        with resources.as_file(resources.files("serving") / "data" / entry["pairs_file"]) as path:
            every = read_lengths(str(path))
        return LengthDistribution(f"{name} ({entry['file']})", every.requests, every.pairs)
    pairs = tuple((i, o) for i in entry["input"]["quantiles"] for o in entry["output"]["quantiles"])
    return LengthDistribution(f"{name} ({entry['file']})", entry["requests"], pairs, True,
                              (entry["input"]["max"], entry["output"]["max"]))


@lru_cache(maxsize=256)
def bundled_for_run(name: str, output_mean: float, input_mean: float) -> LengthDistribution:
    """A bundled set scaled to a run's own mean lengths; a fit prices the same runs many times."""
    return bundled(name).scaled(output_mean, input_mean)


def _count(value, where: str, what: str) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise LengthsError(f"{where}: {what} must be a token count, got '{value}'") from None
    if not (number >= 1 and number == int(number) and number <= MAX_LENGTH):
        raise LengthsError(f"{where}: {what} must be a whole number of tokens in [1, {MAX_LENGTH:g}], got {value}")
    return int(number)


def _columns(keys, where: str) -> tuple[str, str]:
    keys = [k.strip() for k in keys]
    found = [next((k for k in keys if k.lower() in names), None) for names in (INPUT_KEYS, OUTPUT_KEYS)]
    if None in found:
        missing = "input" if found[0] is None else "output"
        names = INPUT_KEYS if missing == "input" else OUTPUT_KEYS
        raise LengthsError(f"{where}: no {missing} length column (one of {', '.join(names)}); found "
                           f"{', '.join(keys) or 'none'}")
    return found[0], found[1]


def read_lengths(path: str) -> LengthDistribution:
    """A file of per-request lengths (CSV or JSONL), or the name of a bundled set."""
    if path in bundled_sets():
        return bundled(path)
    p = Path(path)
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        names = ", ".join(bundled_sets())
        raise LengthsError(f"{path}: cannot read ({e.strerror if isinstance(e, OSError) else 'not text'}; "
                           f"bundled sets: {names})") from None
    lines = text.splitlines()
    first = next((line for line in lines if line.strip()), "")
    pairs = []
    if first.lstrip().startswith("{"):
        for n, row in json_lines(lines, path, LengthsError):
            where = f"{path}:{n}"
            if not isinstance(row, dict):
                raise LengthsError(f"{where}: each line must be a JSON object with input and output lengths")
            ki, ko = _columns(row.keys(), where)
            pairs.append((_count(row[ki], where, ki), _count(row[ko], where, ko)))
            if len(pairs) > MAX_ROWS:
                raise LengthsError(f"{path}: more than {MAX_ROWS:g} requests")
    else:
        reader = csv.reader(lines)
        header = next(reader, None)
        if header is None:
            raise LengthsError(f"{path}: empty (a CSV header with input and output length columns, or JSONL)")
        ki, ko = _columns(header, f"{path}:1")
        col_i, col_o = [k.strip() for k in header].index(ki), [k.strip() for k in header].index(ko)
        for n, row in enumerate(reader, 2):
            if not row or not any(c.strip() for c in row):
                continue
            where = f"{path}:{n}"
            if len(row) <= max(col_i, col_o):
                raise LengthsError(f"{where}: {len(row)} columns, the header has {len(header)}")
            pairs.append((_count(row[col_i], where, ki), _count(row[col_o], where, ko)))
            if len(pairs) > MAX_ROWS:
                raise LengthsError(f"{path}: more than {MAX_ROWS:g} requests")
    if not pairs:
        raise LengthsError(f"{path}: no requests")
    return LengthDistribution(path, len(pairs), tuple(pairs))


__all__ = ["LengthDistribution", "LengthsError", "bundled", "bundled_for_run", "bundled_sets", "fixed_lengths",
           "read_lengths"]
