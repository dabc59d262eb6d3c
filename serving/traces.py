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

from .workload import SimRequest, WorkloadError


def _lines(path: str | Path) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except OSError as e:
        raise WorkloadError(f"cannot read workload {path}: {e}") from None


def _finish(path, out: list[SimRequest]) -> list[SimRequest]:
    if not out:
        raise WorkloadError(f"{path}: no requests")
    out.sort(key=lambda r: r.arrival_s)
    return out


def load_jsonl(path: str | Path) -> list[SimRequest]:
    out = []
    for n, line in enumerate(_lines(path), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            arrival, output = float(d["arrival_s"]), int(d["output_tokens"])
            session = str(d["session"]) if "session" in d else None
            answer = str(d["output_id"]) if "output_id" in d else None
            if "token_ids" in d:
                ids = [int(x) for x in d["token_ids"]]
                req = SimRequest(len(out), arrival, len(ids), output, token_ids=ids, session=session,
                                 output_segment=answer)
            else:
                segs = [(str(s["id"]), int(s["tokens"])) for s in d["segments"]]
                if any(t < 1 for _, t in segs):
                    raise ValueError("segment tokens must be >= 1")
                req = SimRequest(len(out), arrival, sum(t for _, t in segs), output, segments=segs,
                                 session=session, output_segment=answer)
            if req.prompt_tokens < 1 or output < 1 or not math.isfinite(arrival) or arrival < 0:
                raise ValueError("needs >= 1 prompt token, >= 1 output token and a finite arrival_s >= 0")
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise WorkloadError(f"{path}:{n}: bad request line ({type(e).__name__}: {e})") from None
        out.append(req)
    return _finish(path, out)


def load_mooncake(path: str | Path, block_tokens: int = 512) -> list[SimRequest]:
    out = []
    for n, line in enumerate(_lines(path), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            ts, prompt, output = float(d["timestamp"]), int(d["input_length"]), int(d["output_length"])
            ids = [int(x) for x in d["hash_ids"]]
            if prompt < 1 or output < 1 or not math.isfinite(ts) or ts < 0:
                raise ValueError("needs input_length >= 1, output_length >= 1 and a finite timestamp >= 0")
            if len(ids) != math.ceil(prompt / block_tokens):
                raise ValueError(f"{len(ids)} hash_ids for {prompt} tokens: expected ceil({prompt} / "
                                 f"{block_tokens}) = {math.ceil(prompt / block_tokens)} (--mooncake-block-tokens?)")
        except (ValueError, KeyError, TypeError) as e:
            raise WorkloadError(f"{path}:{n}: bad Mooncake line ({type(e).__name__}: {e})") from None
        segs = [(f"mooncake-{h}", block_tokens) for h in ids]
        segs[-1] = (segs[-1][0], prompt - block_tokens * (len(ids) - 1))
        out.append(SimRequest(len(out), ts / 1000.0, prompt, output, segments=segs))
    return _finish(path, out)
