"""User input and the request it becomes: the single place where prefix-cache hits rewrite lengths (RFC 4.2)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from tracer.work import Request


class InputError(ValueError):
    """Invalid user input: reported in one line with exit code 2."""


def check_hit_rate(rate: float) -> float:
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and 0.0 <= rate < 1.0):
        raise InputError(f"--prefix-cache-hit-rate must be in [0, 1), got {rate}")
    return float(rate)


@dataclass(frozen=True)
class RequestInfo:
    """What the model is asked to run, after prefix-cache hits: query_len new tokens over seq_len total."""
    num_queries: int
    query_len: int
    seq_len: int
    cached_tokens: int
    decode: bool

    @property
    def context_len(self) -> int:
        return self.seq_len - self.query_len

    def to_request(self) -> Request:
        return Request(self.num_queries, self.query_len, self.context_len, decode=self.decode)


@dataclass(frozen=True)
class UserInputConfig:
    num_queries: int
    query_length: int
    context_length: int = 0
    decode: bool = False
    prefix_cache_hit_rate: float = 0.0

    def validate(self) -> None:
        if self.num_queries < 1:
            raise InputError(f"--num-queries must be >= 1, got {self.num_queries}")
        if self.query_length < 1:
            raise InputError(f"--query-length must be >= 1, got {self.query_length}")
        if self.context_length < 0:
            raise InputError(f"--context-length must be >= 0, got {self.context_length}")
        check_hit_rate(self.prefix_cache_hit_rate)
        if self.decode and self.query_length != 1:
            raise InputError("--decode runs one new token per sequence: use --query-length 1 (the default)")

    @property
    def hit_rate_applies(self) -> bool:
        """Prefix caching only changes prefill (RFC 3); decode ignores the rate."""
        return not self.decode and self.prefix_cache_hit_rate > 0

    def get_request_info(self) -> RequestInfo:
        """H = floor(Q * rate) query tokens hit the cache: context C + H, query Q - H, seq_len C + Q unchanged."""
        self.validate()
        hits = math.floor(self.query_length * self.prefix_cache_hit_rate) if self.hit_rate_applies else 0
        effective_query = self.query_length - hits
        if effective_query < 1:
            raise InputError(f"effective query length is {effective_query} (query {self.query_length}, hit rate "
                             f"{self.prefix_cache_hit_rate}): at least one token must be computed")
        effective_context = self.context_length + hits
        return RequestInfo(num_queries=self.num_queries, query_len=effective_query,
                           seq_len=effective_context + effective_query, cached_tokens=hits, decode=self.decode)
