"""Forward shapes of a serving workload: the one place prefix caching enters throughput modelling (RFC 4.3).

Every prefill path takes its lengths from here (the effective input length over the cached prefix);
every decode path takes the original lengths, untouched by the prefix cache.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import Field, TypeAdapter, ValidationError

from tracer.work import Request

from .config import InputError, check_hit_rate


@dataclass(frozen=True)
class PrefillChunk:
    batch: int
    tokens: int       # new tokens per sequence in this chunk
    context: int      # tokens before it: the cached prefix plus earlier chunks


@dataclass(frozen=True)
class ServingShapes:
    input_length: int
    output_length: int
    prefix_cache_hit_rate: float = 0.0
    max_prefill_tokens: int = 8192
    prefix_cache_block_size: int = 1   # hits count in whole blocks (1: token granularity, the RFC's)

    def __post_init__(self):
        if self.input_length < 1 or self.output_length < 1:
            raise InputError("--input-length and --output-length must be >= 1")
        if self.prefix_cache_block_size < 1:
            raise InputError("--prefix-cache-block-size must be >= 1")
        if self.max_prefill_tokens < 1:
            raise InputError("--max-prefill-tokens must be >= 1")
        check_hit_rate(self.prefix_cache_hit_rate)
        if self.effective_input_length < 1:
            raise InputError(f"effective input length is {self.effective_input_length}: at least one token must be "
                             f"prefilled")

    @property
    def cached_prefix_tokens(self) -> int:
        hits = math.floor(self.input_length * self.prefix_cache_hit_rate)
        return hits // self.prefix_cache_block_size * self.prefix_cache_block_size

    @property
    def effective_input_length(self) -> int:
        return self.input_length - self.cached_prefix_tokens

    @property
    def chunked(self) -> bool:
        """The effective input exceeds the prefill token budget: it is prefilled in chunks, as engines do."""
        return self.effective_input_length > self.max_prefill_tokens

    @property
    def prefill_batch_size(self) -> int:
        """Requests per prefill wave under the token budget (RFC 4.3), not the user's batch size."""
        return max(1, self.max_prefill_tokens // self.effective_input_length)

    def prefill_chunks(self, batch: int) -> list[PrefillChunk]:
        """One prefill wave of `batch` requests: a single step, or chunks of at most the budget each."""
        if not self.chunked:
            return [PrefillChunk(batch, self.effective_input_length, self.cached_prefix_tokens)]
        chunks, done = [], 0
        while done < self.effective_input_length:
            size = min(self.max_prefill_tokens, self.effective_input_length - done)
            chunks.append(PrefillChunk(1, size, self.cached_prefix_tokens + done))
            done += size
        return chunks

    def prefill_requests(self, batch: int) -> list[Request]:
        return [Request(c.batch, c.tokens, c.context) for c in self.prefill_chunks(batch)]

    def decode_request(self, batch: int) -> Request:
        """A decode step at the mean context of a request's life: the full input plus half the output."""
        return Request(batch, 1, self.input_length + self.output_length // 2, decode=True)

    @property
    def kv_tokens_per_request(self) -> int:
        return self.input_length + self.output_length


MAX_HIT_RATES = 10**7
_HIT_RATES = TypeAdapter(list[Annotated[float, Field(strict=True, ge=0.0, lt=1.0, allow_inf_nan=False)]])


def load_hit_rate_distribution(path: str, bins: int = 8) -> list[tuple[float, float]]:
    """Per-request hit rates (a JSON list, or one number per line) as at most `bins` (rate, weight) pairs."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(f"cannot read hit-rate distribution {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text (byte {e.start})") from None
    if text.lstrip().startswith("["):
        try:
            rates = json.loads(text)
        except ValueError as e:
            raise InputError(f"{path}: not a JSON list ({e})") from None
        where = "entry"
    else:
        rates, lines = [], [line.strip() for line in text.splitlines()]
        for n, line in enumerate(lines, 1):
            if not line:
                continue
            try:
                rates.append(float(line))
            except ValueError:
                raise InputError(f"{path}:{n}: a hit rate is a number in [0, 1), got '{line[:40]}'") from None
        where = "line"
    if isinstance(rates, list) and len(rates) > MAX_HIT_RATES:
        raise InputError(f"{path}: more than {MAX_HIT_RATES:,} hit rates; bin them first")
    try:
        rates = _HIT_RATES.validate_python(rates)
    except ValidationError as e:
        err = e.errors()[0]
        index = err["loc"][0] if err["loc"] else None
        at = "" if index is None else (f":{_line_of(text, index)}" if where == "line" else f": entry {index}")
        msg = err["msg"].replace("Input should be ", "must be ")
        raise InputError(f"{path}{at}: hit rates must be numbers in [0, 1): {msg} (got {err.get('input')!r:.40})") \
            from None
    if not rates:
        raise InputError(f"{path}: no hit rates")
    lo, hi = min(rates), max(rates)
    width = (hi - lo) / bins or 1.0
    groups: dict[int, list[float]] = {}
    for r in rates:
        groups.setdefault(min(bins - 1, int((r - lo) / width)), []).append(r)
    return [(sum(g) / len(g), len(g) / len(rates)) for _, g in sorted(groups.items())]


def _line_of(text: str, index: int) -> int:
    """The line number of the index-th non-empty line."""
    seen = -1
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            seen += 1
            if seen == index:
                return n
    return 0
