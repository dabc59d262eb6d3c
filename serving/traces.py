"""Request traces from files: tracecost's JSONL and the Mooncake FAST'25 release.

tracecost JSONL, one request a line:
    {"arrival_s": 0.5, "segments": [{"id": "system", "tokens": 2048}, ...], "output_tokens": 128,
     "session": "user-17", "output_id": "answer-17"}
("token_ids": [...] may replace segments; session and output_id are optional.)

Mooncake (github.com/kvcache-ai/Mooncake, FAST25-release/traces/*.jsonl), one request a line:
    {"timestamp": ms, "input_length": N, "output_length": M, "hash_ids": [...]}
Each hash id names one block of `block_tokens` (512 in the release) prompt tokens, the last one possibly
partial; equal ids are equal content (the ids are prefix hashes), so each id becomes one segment.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError, model_validator

from cost.profile_schema import validation_message

from .workload import SimRequest, WorkloadError


def _lines(path: str | Path) -> list[str]:
    try:
        return Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise WorkloadError(f"cannot read workload {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise WorkloadError(f"{path}: not UTF-8 text (byte {e.start})") from None


def _finish(path, out: list[SimRequest]) -> list[SimRequest]:
    if not out:
        raise WorkloadError(f"{path}: no requests")
    out.sort(key=lambda r: r.arrival_s)
    return out


MAX_ARRIVAL_S = 1e7            # ~116 days: beyond it microsecond step times vanish in the float
MAX_REQUEST_TOKENS = 10**8     # one request's prompt or output; whole-workload limits are the CLI's


class _Line(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class SegmentLine(_Line):
    id: StrictStr | StrictInt
    tokens: Annotated[int, Field(ge=1, le=MAX_REQUEST_TOKENS)]


class RequestLine(_Line):
    """One line of a tracecost JSONL workload."""
    arrival_s: Annotated[float, Field(ge=0.0, le=MAX_ARRIVAL_S, allow_inf_nan=False)]
    output_tokens: Annotated[int, Field(ge=1, le=MAX_REQUEST_TOKENS)]
    segments: list[SegmentLine] | None = Field(None, min_length=1)
    token_ids: list[StrictInt] | None = Field(None, min_length=1, max_length=MAX_REQUEST_TOKENS)
    session: StrictStr | StrictInt | None = None
    output_id: StrictStr | StrictInt | None = None

    @model_validator(mode="after")
    def _one_prompt(self):
        if (self.segments is None) == (self.token_ids is None):
            raise ValueError("give the prompt as either segments or token_ids")
        if self.segments and sum(s.tokens for s in self.segments) > MAX_REQUEST_TOKENS:
            raise ValueError(f"a prompt of more than {MAX_REQUEST_TOKENS:,} tokens")
        return self


class MooncakeLine(_Line):
    """One line of a Mooncake FAST'25 trace."""
    timestamp: Annotated[float, Field(ge=0.0, le=MAX_ARRIVAL_S * 1e3, allow_inf_nan=False)]
    input_length: Annotated[int, Field(ge=1, le=MAX_REQUEST_TOKENS)]
    output_length: Annotated[int, Field(ge=1, le=MAX_REQUEST_TOKENS)]
    hash_ids: list[StrictInt] = Field(min_length=1)


def _parse(model, line: str, path, n: int, what: str):
    try:
        data = json.loads(line)
    except ValueError as e:
        raise WorkloadError(f"{path}:{n}: not JSON ({e})") from None
    if not isinstance(data, dict):
        raise WorkloadError(f"{path}:{n}: a {what} line is a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise WorkloadError(validation_message(e, f"{path}:{n}")) from None


def load_jsonl(path: str | Path) -> list[SimRequest]:
    out = []
    for n, line in enumerate(_lines(path), 1):
        if not line.strip():
            continue
        d = _parse(RequestLine, line, path, n, "request")
        session = None if d.session is None else str(d.session)
        answer = None if d.output_id is None else str(d.output_id)
        if d.token_ids is not None:
            req = SimRequest(len(out), d.arrival_s, len(d.token_ids), d.output_tokens, token_ids=list(d.token_ids),
                             session=session, output_segment=answer)
        else:
            segs = [(str(s.id), s.tokens) for s in d.segments]
            req = SimRequest(len(out), d.arrival_s, sum(t for _, t in segs), d.output_tokens, segments=segs,
                             session=session, output_segment=answer)
        out.append(req)
    return _finish(path, out)


def load_mooncake(path: str | Path, block_tokens: int = 512) -> list[SimRequest]:
    out = []
    for n, line in enumerate(_lines(path), 1):
        if not line.strip():
            continue
        d = _parse(MooncakeLine, line, path, n, "Mooncake")
        expected = math.ceil(d.input_length / block_tokens)
        if len(d.hash_ids) != expected:
            raise WorkloadError(f"{path}:{n}: field 'hash_ids': {len(d.hash_ids)} ids for {d.input_length} tokens, "
                                f"expected ceil({d.input_length} / {block_tokens}) = {expected} "
                                f"(--mooncake-block-tokens?)")
        segs = [(f"mooncake-{h}", block_tokens) for h in d.hash_ids]
        segs[-1] = (segs[-1][0], d.input_length - block_tokens * (len(d.hash_ids) - 1))
        out.append(SimRequest(len(out), d.timestamp / 1000.0, d.input_length, d.output_length, segments=segs))
    return _finish(path, out)
