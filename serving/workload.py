"""Serving workloads: presets and JSONL traces, turned into requests with block identities.

A block's identity depends on its tokens and every token before it (vLLM's prefix hashing): it is a
hash chained over the blocks. Segments with the same id are the same token run, so two prompts share
their leading blocks exactly as far as their leading segments agree, to whole blocks.
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path


class WorkloadError(ValueError):
    """A bad workload file or preset argument; the message names the line."""


@dataclass
class SimRequest:
    rid: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    segments: list[tuple[str, int]] | None = None     # (id, tokens)
    token_ids: list[int] | None = None
    block_hashes: list[int] = field(default_factory=list)

    def hash_blocks(self, block_size: int) -> None:
        """Chain-hash every full block of the prompt; a partial last block has no identity (never hits)."""
        hashes, prev = [], 0
        full_blocks = self.prompt_tokens // block_size
        if self.token_ids is not None:
            for b in range(full_blocks):
                prev = hash((prev, tuple(self.token_ids[b * block_size:(b + 1) * block_size])))
                hashes.append(prev)
        else:
            pieces = []  # (segment id, start, end) runs of each block
            seg_iter = iter(self.segments)
            seg_id, seg_len = next(seg_iter)
            offset = 0
            for _ in range(full_blocks):
                need, pieces = block_size, []
                while need:
                    take = min(need, seg_len - offset)
                    pieces.append((seg_id, offset, offset + take))
                    offset += take
                    need -= take
                    if offset == seg_len:
                        seg_id, seg_len = next(seg_iter, ("", 0))
                        offset = 0
                prev = hash((prev, tuple(pieces)))
                hashes.append(prev)
        self.block_hashes = hashes


PRESETS = ("shared-system-prompt", "timestamp-first", "multi-turn-chat", "document-qa")


@dataclass(frozen=True)
class PresetSizes:
    system_tokens: int = 2048
    user_tokens: int = 64
    output_tokens: int = 128
    turns: int = 4
    documents: int = 4
    document_tokens: int = 8192
    question_tokens: int = 32


def _arrivals(n: int, rate: float | None, rng: random.Random) -> list[float]:
    if not rate:
        return [0.0] * n
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def preset(name: str, num_requests: int, rate: float | None, seed: int, sizes: PresetSizes) -> list[SimRequest]:
    if name not in PRESETS:
        raise WorkloadError(f"unknown workload '{name}' (presets: {', '.join(PRESETS)}; or a .jsonl file)")
    rng = random.Random(seed)
    arrivals = _arrivals(num_requests, rate, rng)
    out = []
    sessions: dict[int, list[tuple[str, int]]] = {}
    for i in range(num_requests):
        if name == "shared-system-prompt":
            segs = [("system", sizes.system_tokens), (f"user-{i}", sizes.user_tokens)]
        elif name == "timestamp-first":
            # a changing token at the very start: every block after it is new
            segs = [(f"timestamp-{i}", 1), ("system", sizes.system_tokens), (f"user-{i}", sizes.user_tokens)]
        elif name == "document-qa":
            segs = [("system", sizes.system_tokens // 8 or 1), (f"doc-{rng.randrange(sizes.documents)}",
                                                                sizes.document_tokens), (f"q-{i}", sizes.question_tokens)]
        else:  # multi-turn-chat: turn t of a session resends the history plus the previous answers;
            # sessions take turns round-robin, as concurrent users do, so a session's next turn comes late
            session = i % math.ceil(num_requests / sizes.turns)
            history = sessions.setdefault(session, [("system", sizes.system_tokens)])
            segs = history + [(f"user-{session}-{i}", sizes.user_tokens)]
            sessions[session] = segs + [(f"assistant-{session}-{i}", sizes.output_tokens)]
        out.append(SimRequest(i, arrivals[i], sum(t for _, t in segs), sizes.output_tokens, segments=segs))
    return out


def load_jsonl(path: str | Path) -> list[SimRequest]:
    out = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise WorkloadError(f"cannot read workload {path}: {e}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            arrival, output = float(d["arrival_s"]), int(d["output_tokens"])
            if "token_ids" in d:
                ids = [int(x) for x in d["token_ids"]]
                req = SimRequest(len(out), arrival, len(ids), output, token_ids=ids)
            else:
                segs = [(str(s["id"]), int(s["tokens"])) for s in d["segments"]]
                if any(t < 1 for _, t in segs):
                    raise ValueError("segment tokens must be >= 1")
                req = SimRequest(len(out), arrival, sum(t for _, t in segs), output, segments=segs)
            if req.prompt_tokens < 1 or output < 1 or arrival < 0:
                raise ValueError("needs >= 1 prompt token, >= 1 output token and arrival_s >= 0")
        except (ValueError, KeyError, TypeError) as e:
            raise WorkloadError(f"{path}:{n}: bad request line ({type(e).__name__}: {e})") from None
        out.append(req)
    if not out:
        raise WorkloadError(f"{path}: no requests")
    out.sort(key=lambda r: r.arrival_s)
    return out
