"""Serving workloads: presets turned into requests with block identities.

A block's identity depends on its tokens and every token before it (vLLM's prefix hashing): it is a
hash chained over the blocks. Segments with the same id are the same token run, so two prompts share
their leading blocks exactly as far as their leading segments agree, to whole blocks. A request's
output is a segment too: named when a later prompt resends it (a chat answer), unique otherwise.
"""
from __future__ import annotations

import gc
import math
import random
from dataclasses import dataclass, field


class WorkloadError(ValueError):
    """A bad workload file or preset argument; the message names the line."""


Piece = tuple  # (segment id, start, end): a run of one segment's tokens


@dataclass
class SimRequest:
    rid: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    segments: list[tuple[str, int]] | None = None     # (id, tokens)
    token_ids: list[int] | None = None
    session: str | None = None                         # the user/conversation it belongs to, if known
    output_segment: str | None = None                  # id of the answer when a later prompt resends it
    block_hashes: list[int] = field(default_factory=list)
    hashed_block_size: int = 0

    def content(self) -> list[tuple[object, int]]:
        """The prompt then the output as (segment id, tokens) runs."""
        runs = (list(self.segments) if self.token_ids is None
                else [(("token", t), 1) for t in self.token_ids])
        runs.append((self.output_segment or ("output", self.rid), self.output_tokens))
        return runs

    def hash_blocks(self, block_size: int, memo: dict | None = None) -> None:
        """Chain-hash every full block of prompt + output; a partial last block has no identity (never hits).
        The first prompt_tokens // block_size hashes are the prompt's. `memo` (shared by the requests of one
        workload, see hash_requests) remembers each run's hashes after a given prefix state, so a prefix that
        many prompts share (a system prompt, a chat's history) is hashed once."""
        if self.hashed_block_size == block_size and self.block_hashes:
            return
        hashes, state = [], (0, ())     # (hash of the blocks so far, pieces of the partial block after them)
        for seg_id, n in self.content():
            key = (state, seg_id, n)
            done = memo.get(key) if memo is not None else None
            if done is None:
                done = _hash_run(state, seg_id, n, block_size)
                if memo is not None:
                    memo[key] = done
            hashes.extend(done[0])
            state = done[1]
        self.block_hashes = hashes
        self.hashed_block_size = block_size

    def pieces(self, tokens: int) -> list[Piece]:
        """The first `tokens` tokens of prompt + output as runs, for token-granular (radix) matching."""
        out, left = [], tokens
        for seg_id, n in self.content():
            if left <= 0:
                break
            take = min(n, left)
            out.append((seg_id, 0, take))
            left -= take
        return out


def _hash_run(state: tuple, seg_id, n: int, block_size: int) -> tuple[list[int], tuple]:
    """The hashes of the blocks that a run of `n` tokens of one segment completes after `state` (the chained
    hash so far, and the pieces of a partial block), and the state after it. A block is named by its pieces
    (segment, start, end) and the hash before it; 0 means no hash, so a hash of 0 becomes 1."""
    prev, pending = state
    out, offset = [], 0
    if pending:
        need = block_size - sum(b - a for _, a, b in pending)
        if n < need:
            return out, (prev, pending + ((seg_id, 0, n),))
        prev = hash((prev, pending + ((seg_id, 0, need),))) or 1
        out.append(prev)
        offset = need
    while n - offset >= block_size:
        prev = hash((prev, ((seg_id, offset, offset + block_size),))) or 1
        out.append(prev)
        offset += block_size
    return out, (prev, ((seg_id, offset, n),) if offset < n else ())


def hash_requests(requests: list[SimRequest], block_size: int) -> None:
    """Hash every request's blocks, each shared prefix once. The cyclic collector is paused meanwhile: this builds
    millions of small objects and no cycles, and its passes over them cost more than the hashing (3x at 10^5
    chat requests)."""
    memo: dict = {}
    paused = gc.isenabled()
    gc.disable()
    try:
        for r in requests:
            r.hash_blocks(block_size, memo)
    finally:
        if paused:
            gc.enable()


PRESETS = ("random", "shared-system-prompt", "timestamp-first", "multi-turn-chat", "document-qa")


@dataclass(frozen=True)
class PresetSizes:
    system_tokens: int = 2048
    user_tokens: int = 64
    output_tokens: int = 128
    turns: int = 4
    documents: int = 4
    document_tokens: int = 8192
    question_tokens: int = 32
    input_tokens: int = 512      # the random preset: a fresh prompt of this many tokens per request


ARRIVALS = ("poisson", "constant")


def arrival_times(n: int, rate: float | None, rng: random.Random, process: str = "poisson") -> list[float]:
    """Open-loop arrival times: Poisson or evenly spaced at `rate` per second; all at 0 without a rate."""
    if not rate:
        return [0.0] * n
    if process == "constant":
        return [i / rate for i in range(n)]
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def preset(name: str, num_requests: int, rate: float | None, seed: int, sizes: PresetSizes,
           arrival: str = "poisson") -> list[SimRequest]:
    if name not in PRESETS:
        raise WorkloadError(f"unknown workload '{name}' (presets: {', '.join(PRESETS)}; a .jsonl file; "
                            f"or mooncake:FILE)")
    rng = random.Random(seed)
    arrivals = arrival_times(num_requests, rate, rng, arrival)
    out = []
    sessions: dict[int, list[tuple[str, int]]] = {}
    for i in range(num_requests):
        session, answer = f"user-{i}", None
        if name == "random":   # benchmark clients' random prompts: nothing shared
            segs = [(f"prompt-{i}", sizes.input_tokens)]
        elif name == "shared-system-prompt":
            segs = [("system", sizes.system_tokens), (f"user-{i}", sizes.user_tokens)]
        elif name == "timestamp-first":
            # a changing token at the very start: every block after it is new
            segs = [(f"timestamp-{i}", 1), ("system", sizes.system_tokens), (f"user-{i}", sizes.user_tokens)]
        elif name == "document-qa":
            doc = rng.randrange(sizes.documents)
            session = f"doc-{doc}"
            segs = [("system", sizes.system_tokens // 8 or 1), (f"doc-{doc}", sizes.document_tokens),
                    (f"q-{i}", sizes.question_tokens)]
        else:  # multi-turn-chat: turn t of a session resends the history plus the previous answers;
            # sessions take turns round-robin, as concurrent users do, so a session's next turn comes late
            s = i % math.ceil(num_requests / sizes.turns)
            session = f"session-{s}"
            history = sessions.setdefault(s, [("system", sizes.system_tokens)])
            segs = history + [(f"user-{s}-{i}", sizes.user_tokens)]
            answer = f"assistant-{s}-{i}"
            sessions[s] = segs + [(answer, sizes.output_tokens)]
        out.append(SimRequest(i, arrivals[i], sum(t for _, t in segs), sizes.output_tokens, segments=segs,
                              session=session, output_segment=answer))
    return out
