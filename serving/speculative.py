"""Speculative decoding as the engines run it (vLLM's spec_decode, SGLang's EAGLE worker, TensorRT-LLM's MTP and
Eagle3): every step a draft proposes k tokens per decoding request; the target verifies them in one forward over
k + 1 query tokens per request, its attention over the request's context priced with the fitted prefill-chunk
model (never as k decode steps); the accepted tokens and one of the target's own advance the request.

Drafts, chosen by name:
  mtp      the model's own multi-token-prediction layer (DeepSeek-V3/R1, GLM-4.5, MiMo): one decoder layer of the
           target's architecture, reused for every proposed token, with the target's embedding and head
  eagle3   an EAGLE-3 head: one Llama decoder layer of the target's width, with its own 32k-token head
  draft    a separate smaller model (draft:MODEL), its own KV cache
  ngram    prompt lookup on the host: no GPU work

A draft's first forward catches up on the tokens the last verification accepted (k + 1 per request, as a
prefill chunk) and on the step's prompt tokens, whose KV (or hidden states) the draft needs before it can propose
after them; each further proposal is a one-token decode. Its weights and KV count against the replica's
memory. Acceptance is an input (serving/data/speculative.json holds published defaults, each with its source).

Tree drafts (SGLang's --speculative-eagle-topk > 1, python/sglang/srt/speculative/eagle_worker.py): the draft
runs k steps, each of its k - 1 forwards after the catch-up over topk candidate rows per request (one per node
of the tree's frontier); the best N - 1 candidates by path score, with the last verified token as the root, make
the N = --speculative-num-draft-tokens tokens the target verifies in one forward under a tree mask
(eagle_utils.py organize_draft_results). The accepted path is at most k deep.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources

from cost.engine_kernels.params import ParamSet, param
from cost.engines import ENGINES, scheduled_ahead
from cost.execution import ENGINE
from tracer.model_source import ModelSpec, resolve_model
from tracer.trace import trace
from tracer.work import Request

from .capacity import ReplicaMemory, kv_bytes_per_token, weight_bytes_per_gpu
from .step_cost import StepCost, _lerp

EAGLE3_VOCAB = 32000     # the draft vocabulary of the published EAGLE-3 heads (draft_vocab_size)
# engines that cap the running batch when they speculate, unless told otherwise: SGLang resets
# max_running_requests to 48 for EAGLE, EAGLE3 and NEXTN (python/sglang/srt/server_args.py)
SPECULATIVE_MAX_RUNNING = {"sglang": 48}
# methods whose drafts an engine gives KV slots beyond the verification's, k per running request: vLLM V1's scheduler
# allocates each step's k + 1 verified tokens plus num_lookahead_tokens = k for EAGLE-style drafts (eagle, eagle3,
# MTP) and draft models, 0 for n-gram lookup (v1/core/sched/scheduler.py Scheduler.__init__, allocate_slots)
LOOKAHEAD_KV_METHODS = {"vllm": ("eagle3", "mtp", "draft")}
# fp32 copies of a (max_num_seqs x vocab) logits block that an engine's memory profile holds beyond its plain
# sampler's when it speculates: vLLM's profile run warms the rejection sampler up on one draft token per request
# (gpu_model_runner.py _dummy_sampler_run), holding the bonus token's log-probabilities, the raw target logits and
# their clone at once (v1/sample/rejection_sampler.py forward). The KV budget loses it: Llama-3.3-70B on TP2 over two
# H100 80GB at max_num_seqs 256 logs 0.36-0.37 GiB more memory beside weights and KV with a draft model or an
# EAGLE-3 head than without, for every k from 3 to 8 (tomasruizt/vllm-scripts @d94d714 online-throughput logs),
# 3 x 256 x 128256 x 4 B = 0.367 GiB
VERIFY_WARMUP_FP32_LOGITS = {"vllm": 3}
MAX_K = 16
MAX_TOPK = 32
MAX_DRAFT_TOKENS = 256


@lru_cache(maxsize=1)
def _defaults() -> dict:
    return json.loads((resources.files("serving") / "data" / "speculative.json").read_text())


@dataclass(frozen=True)
class Speculation:
    method: str                       # mtp | eagle3 | draft | ngram
    k: int                            # draft steps: tokens one path proposes (SGLang speculative_num_steps)
    acceptance: tuple[float, ...]     # P(the accepted path grows at depth i | it reached i - 1); the last repeats
    source: str                       # where the acceptance comes from
    draft_model: str | None = None    # draft:MODEL
    topk: int = 1                     # candidates per tree node (SGLang speculative_eagle_topk); 1: a chain
    draft_tokens: int = 0             # tokens verified per request, the root included (a tree's N); 0: k + 1

    @property
    def tree(self) -> bool:
        return self.topk > 1

    @property
    def verify_tokens(self) -> int:
        """Query rows per request of the target's verification: the last verified token and the proposals."""
        return self.draft_tokens or self.k + 1

    @property
    def depth(self) -> int:
        """The most proposals one step can accept: the draft's steps, or fewer when N - 1 tokens cannot reach."""
        return min(self.k, self.verify_tokens - 1)

    @property
    def width(self) -> float:
        """Verified candidates per depth of the tree, at most topk: N - 1 spread over the depth (1 for a chain)."""
        return min(self.topk, (self.verify_tokens - 1) / self.depth)

    def accepted_through(self, i: int) -> float:
        """P(the first i proposals are all accepted)."""
        p = 1.0
        for j in range(i):
            p *= self.acceptance[min(j, len(self.acceptance) - 1)]
        return p

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens a request gains per step: the accepted proposals and the target's own next token."""
        return 1.0 + sum(self.accepted_through(i) for i in range(1, self.depth + 1))

    @property
    def method_name(self) -> str:
        """The method as --speculative names it (parse_speculation): draft:MODEL for a draft model."""
        return f"draft:{self.draft_model}" if self.method == "draft" else self.method

    @property
    def label(self) -> str:
        return f"{self.method_name} k={self.k}" + (f" topk={self.topk} N={self.verify_tokens}" if self.tree else "")

    def describe(self) -> str:
        rates = ", ".join(f"{a:.3g}" for a in self.acceptance[:self.depth])
        shape = (f"a tree verifying {self.verify_tokens} tokens per request, {self.width:.3g} candidates per depth; "
                 if self.tree else "")
        return (f"speculative decoding: {self.label}, {self.tokens_per_step:.2f} tokens per step "
                f"({shape}acceptance {rates} per {'depth' if self.tree else 'position'}; {self.source})")


METHODS = ("mtp", "eagle3", "ngram", "draft:MODEL")


def parse_speculation(method: str, k: int = 1, acceptance_rate: float | None = None,
                      acceptance_length: float | None = None, topk: int = 1,
                      draft_tokens: int | None = None) -> Speculation:
    """A speculation setup from the CLI's words; ValueError (one line) for anything inconsistent. `topk` > 1 with
    `draft_tokens` N is a tree draft as SGLang runs it; a given rate or length is the setup's own (per depth of a
    tree, as engines report it), the published default is a chain's, widened for a tree (tree_acceptance)."""
    name, _, draft = method.strip().partition(":")
    name = name.lower()
    if name not in ("mtp", "eagle3", "ngram", "draft") or (name == "draft") != bool(draft):
        raise ValueError(f"unknown speculative method '{method}' (choose from {', '.join(METHODS)})")
    if not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise ValueError(f"--num-speculative-tokens must be an integer in 1..{MAX_K}, got {k}")
    n = _tree_shape(name, k, topk, draft_tokens)
    shape = dict(draft_model=draft or None, topk=topk, draft_tokens=n if topk > 1 else 0)
    depth = min(k, n - 1)         # Speculation.depth
    if acceptance_rate is not None and acceptance_length is not None:
        raise ValueError("give --acceptance-rate or --acceptance-length, not both")
    if acceptance_rate is not None:
        if not 0.0 < acceptance_rate < 1.0:
            raise ValueError(f"--acceptance-rate must be in (0, 1), got {acceptance_rate}")
        return Speculation(name, k, (acceptance_rate,), "acceptance rate as given", **shape)
    if acceptance_length is not None:
        if not 1.0 < acceptance_length < depth + 1:
            raise ValueError(f"--acceptance-length must be in (1, {depth + 1}) for "
                             f"{'a tree of depth' if topk > 1 else 'k ='} {depth} (mean tokens per step, the "
                             f"target's own included), got {acceptance_length}")
        rate = _rate_for_length(acceptance_length, depth)
        return Speculation(name, k, (rate,), f"acceptance length {acceptance_length:g} as given", **shape)
    entry = _defaults().get(name)
    if entry is None:
        raise ValueError(f"'{name}' speculation has no published default acceptance (it depends on the draft and "
                         f"the workload): pass --acceptance-rate or --acceptance-length")
    chain = Speculation(name, k, tuple(entry["acceptance"]), f"default: {entry['source']}", **shape)
    return tree_acceptance(chain) if topk > 1 else chain


def _tree_shape(name: str, k: int, topk: int, draft_tokens: int | None) -> int:
    """The tokens a step verifies per request (N), checked as SGLang's server_args.py and eagle_utils.py take them:
    a chain verifies k + 1; a tree picks N - 1 of the topk + (k - 1) topk^2 candidates its k steps propose."""
    if not isinstance(topk, int) or not 1 <= topk <= MAX_TOPK:
        raise ValueError(f"--speculative-eagle-topk must be an integer in 1..{MAX_TOPK}, got {topk}")
    if topk == 1:
        if draft_tokens not in (None, k + 1):
            raise ValueError(f"a chain (--speculative-eagle-topk 1) verifies k + 1 = {k + 1} tokens per request, "
                             f"got --speculative-num-draft-tokens {draft_tokens}")
        return k + 1
    if name == "ngram":
        raise ValueError("n-gram lookup proposes a chain: --speculative-eagle-topk is for model drafts")
    if draft_tokens is None:
        raise ValueError("a tree draft (--speculative-eagle-topk > 1) needs --speculative-num-draft-tokens N, the "
                         "tokens the target verifies per request")
    pool = topk + (k - 1) * topk * topk
    if not isinstance(draft_tokens, int) or not 2 <= draft_tokens <= min(pool + 1, MAX_DRAFT_TOKENS):
        raise ValueError(f"--speculative-num-draft-tokens must be an integer in 2..{min(pool + 1, MAX_DRAFT_TOKENS)} "
                         f"for k = {k}, topk = {topk} (the root and at most the {pool} candidates its steps "
                         f"propose), got {draft_tokens}")
    return draft_tokens


def sibling_miss() -> float:
    """The share of a tree node's misses that each further verified sibling still misses: with a chain's
    acceptance a at a position, a tree verifying w candidates there accepts 1 - (1 - a) * rho^(w - 1). One number,
    in (0, 1] (1: siblings never help), solved from one published chain/tree pair on the same model, engine and
    data (serving/data/speculative.json "tree"), each side's per-position acceptance taken constant."""
    pair = _defaults()["tree"]
    chain, tree = pair["chain"], pair["tree"]
    a = _rate_for_length(chain["acceptance_length"], chain["k"])
    shape = Speculation("eagle3", tree["k"], (0.5,), "", topk=tree["topk"], draft_tokens=tree["draft_tokens"])
    b = _rate_for_length(tree["acceptance_length"], shape.depth)
    return min(1.0, ((1 - b) / (1 - a)) ** (1 / (shape.width - 1)))


def tree_acceptance(chain: Speculation) -> Speculation:
    """A tree's acceptance per depth from its draft's chain acceptance, each depth widened by the tree's verified
    candidates there (Speculation.width, the N - 1 tokens spread over the depth): 1 - (1 - a) rho^(width - 1)."""
    rho, w = sibling_miss(), chain.width
    rates = tuple(1 - (1 - chain.acceptance[min(i, len(chain.acceptance) - 1)]) * rho ** (w - 1)
                  for i in range(chain.depth))
    return replace(chain, acceptance=rates,
                   source=f"{chain.source}; widened for the tree: each candidate beyond the first catches "
                          f"{1 - rho:.0%} of the rest ({_defaults()['tree']['source']})")


def _rate_for_length(length: float, k: int) -> float:
    """The per-position acceptance a with 1 + a + ... + a^k = length (bisection: the sum grows with a)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid ** i for i in range(k + 1)) < length:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


# -- the host work an engine stops hiding when it speculates -----------------------------------------------------
@dataclass(frozen=True)
class SerialHost(ParamSet):
    """The scheduler's host work per step that an overlap scheduler runs while the GPU computes the previous step
    (SGLang's zero-overhead scheduler: batch scheduling, memory allocation, prefix matching, result processing),
    and that runs in series with the GPU when the engine turns the overlap off to speculate. The fitted plain-step
    overheads (cost/engine_serving.json) hold none of it: there it is hidden."""
    step_us: float = param(0.0, 0.0, 5000.0, "host work per speculative step run in series with the GPU, us")
    # per request: the Python bookkeeping of its verified tokens (appending, stop checks). Tens of us at most:
    # SGLang's overlap gains 1.1x at full batches of hundreds (lmsys.org/blog/2024-12-04-sglang-v0-4), which a
    # hidden per-request cost of hundreds of us would make several times
    seq_us: float = param(0.0, 0.0, 50.0, "host work per running request per speculative step run in series, us")

    def seconds(self, sequences: float) -> float:
        return (self.step_us + self.seq_us * sequences) * 1e-6 if sequences > 0 else 0.0


def serial_host(engine: str) -> tuple[SerialHost, str] | None:
    """(the host work in series, where it comes from) for an engine that disables its overlap scheduler when it
    speculates (serving/data/speculative.json "serial_host"), None for one that keeps it."""
    entry = _defaults().get("serial_host", {}).get(engine)
    if entry is None:
        return None
    where = f"serving/data/speculative.json: serial_host.{engine}"
    return SerialHost.from_json(entry["params"], where), f"{entry['source']}; {entry['fit']}"


# -- the draft as a model ---------------------------------------------------------------------------------------
MTP_LAYER_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers")


def mtp_layers(config: dict) -> int:
    text = config.get("text_config") or {}
    return int(next((c.get(k) for c in (config, text) for k in MTP_LAYER_KEYS if c.get(k)), 0) or 0)


def _mtp_draft(target: ModelSpec) -> ModelSpec:
    if not mtp_layers(target.config):
        raise ValueError(f"{target.name} has no multi-token-prediction layer (no num_nextn_predict_layers in its "
                         f"config): use eagle3, draft:MODEL or ngram")
    config = {**target.config, "num_hidden_layers": 1}
    if "first_k_dense_replace" in config:   # DeepSeek's and GLM's MTP layer is a MoE layer like the last ones
        config["first_k_dense_replace"] = 0
    for key in ("layer_types", "mlp_only_layers"):
        config.pop(key, None)
    return ModelSpec(f"{target.name} MTP layer", config, f"{target.origin} (its MTP layer)", target.folder)


def _eagle3_draft(target: ModelSpec) -> ModelSpec:
    c = {**(target.config.get("text_config") or {}), **target.config}
    hidden = int(c["hidden_size"])
    heads = int(c.get("num_attention_heads") or max(1, hidden // 128))
    head_dim = int(c.get("head_dim") or hidden // heads)
    kv_heads = int(c.get("num_key_value_heads") or heads)
    if hidden % heads:      # a target whose attention is wider than its hidden size (GLM-4.5: 96 x 128 over 4096):
        heads = max(1, hidden // head_dim)      # the head is a plain Llama layer, heads of the target's head dim
        kv_heads = kv_heads if heads % kv_heads == 0 else heads
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
              "num_hidden_layers": 1, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "head_dim": head_dim,
              "intermediate_size": int(c.get("intermediate_size") or 4 * hidden), "vocab_size": EAGLE3_VOCAB,
              "max_position_embeddings": int(c.get("max_position_embeddings") or 131072),
              "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16", "tie_word_embeddings": False}
    return ModelSpec(f"{target.name} EAGLE-3 head", config, "an EAGLE-3 head: one Llama layer of the target's width")


def eagle3_fusion_params(head: dict) -> int:
    """Weights an EAGLE-3 head holds beyond the one Llama layer of width h it is traced as (_eagle3_draft): the fusion
    of the target's three hidden states (fc, 3h -> h) and the second h of its attention's input, the token's
    embedding beside the hidden state (q, k and v project 2h, not h). `head`: the traced head's config."""
    h, head_dim = int(head["hidden_size"]), int(head["head_dim"])
    return 3 * h * h + h * head_dim * (int(head["num_attention_heads"]) + 2 * int(head["num_key_value_heads"]))


def draft_spec(target: ModelSpec, speculation: Speculation, trust_remote_code: bool = False) -> ModelSpec | None:
    """The model the draft runs (None: n-gram lookup runs no model)."""
    if speculation.method == "mtp":
        return _mtp_draft(target)
    if speculation.method == "eagle3":
        return _eagle3_draft(target)
    if speculation.method == "draft":
        return resolve_model(speculation.draft_model, trust_remote_code=trust_remote_code)
    return None


DRAFT_NOTES = {
    "mtp": "the MTP layer's input projection (2h -> h) and norms are not priced; its embedding and head are "
           "the target's, counted once in memory",
    "eagle3": "EAGLE-3's feature fusion (3h -> h) and its layer's 2h-wide attention input count in memory; their "
              "time is priced as one Llama layer of width h",
    "draft": "the draft model runs with the target's tensor parallelism",
    "ngram": "n-gram lookup runs on the host; its time is not priced",
}


@dataclass(frozen=True)
class DraftForward:
    """One forward of the draft in a speculative step."""
    rows: float          # query rows across the batch (a mean batch: fractional)
    per_request: int     # query rows per request
    head_rows: float     # rows the draft's head projects and samples
    catch_up: bool       # over the tokens the last step verified, as a prefill chunk; else one-token rows


class SpeculativeStep:
    """Step times and memory of a replica that speculates: the target's StepCost and the draft's (None: n-gram).
    Offers StepCost's interface, so the steady state, the search and the simulator price it the same way."""

    def __init__(self, target: StepCost, speculation: Speculation, draft: StepCost | None):
        self.target, self.speculation, self.draft = target, speculation, draft
        self.tokens_per_step = speculation.tokens_per_step
        # each verification writes the drafts' KV beside the last token's: slots held beyond the accepted tokens, and
        # an engine's lookahead for the next step's drafts
        lookahead = speculation.k if speculation.method in LOOKAHEAD_KV_METHODS.get(target.engine, ()) else 0
        self.spare_kv_slots = speculation.verify_tokens - 1 + lookahead
        self._draft_memory: tuple[float, float] | None = None
        found = serial_host(target.engine) if target.execution == ENGINE else None
        self.serial_host, self._serial_origin = found if found else (None, "")
        # an engine that schedules ahead of the GPU without speculating, but not with this draft
        self.host_in_series = target.async_scheduling and not scheduled_ahead(
            target.engine, target.release, target.par.pp, speculation.method)

    def __getattr__(self, name):     # defaults, overhead_origin, stage_factor, ... are the target's
        return getattr(self.target, name)

    @property
    def defaults(self):
        cap = SPECULATIVE_MAX_RUNNING.get(self.target.engine)
        d = self.target.defaults
        return replace(d, max_num_seqs=min(d.max_num_seqs, cap)) if cap else d

    @property
    def overheads(self):
        return self.target.overheads

    @overheads.setter
    def overheads(self, value) -> None:   # a fit tries overheads on the target that prices the step
        self.target.overheads = value

    def formats_notes(self) -> list[str]:
        notes = [self.speculation.describe(), DRAFT_NOTES[self.speculation.method]]
        if self.serial_host is not None:
            h = self.serial_host
            notes.append(f"{ENGINES[self.target.engine].label} speculates without its "
                         f"overlap scheduler: {h.step_us:g} us per step and {h.seq_us:g} us per running request of "
                         f"host work run in series with the GPU ({self._serial_origin})")
        if self.host_in_series:
            rule = ENGINES[self.target.engine].async_scheduling
            what = {"draft": "a draft model", "ngram": "n-gram lookup"}.get(self.speculation.method,
                                                                              f"a {self.speculation.method} draft")
            notes.append(f"{ENGINES[self.target.engine].label} does not schedule asynchronously when it speculates "
                         f"with {what}: the scheduler's host work runs in series with the GPU, as without "
                         f"speculation it does not ({rule.source})")
        t = self.target
        if t.execution == "engine" and not all(p.shares_kv_head_ctas
                                               for p in t.hw.engine(t.engine).prefill_attention.values()):
            notes.append(f"verification attention priced with {ENGINES[t.engine].label}'s context-kernel model, a CTA "
                         f"per query head; its generation-phase speculative kernel (XQA) packs a KV head's query "
                         f"heads, so on a GQA model the verification's attention may be priced high")
        return t.formats_notes() + notes

    def serial_host_s(self, sequences: float) -> float:
        """The host work the engine runs in series with the GPU in a speculative step of `sequences` requests."""
        return self.serial_host.seconds(sequences) if self.serial_host is not None else 0.0

    def draft_forwards(self, decoding: float, prompt_tokens: float = 0.0, prompts: float = 0.0) -> list[DraftForward]:
        """The draft's forwards in a step of `decoding` requests and `prompt_tokens` prompt tokens in `prompts`
        chunks: a catch-up over the k + 1 tokens the last step verified (SGLang pads it to k + 1 for its graphs;
        its head samples one row per request) and over the prompt tokens, its head on a chunk's last row (vLLM's
        proposers run the draft over every token the step scheduled; SGLang's EAGLE worker runs its draft-extend
        over each prefilled prompt; TensorRT-LLM's MTP layers over the context), then k - 1 proposals of topk rows
        per decoding request each (one per frontier node of a tree; one for a chain), each row a one-token decode
        over the context, its head sampled for the top-k (SGLang eagle_worker.py draft_forward)."""
        if self.draft is None or (decoding <= 0 and prompt_tokens <= 0):
            return []
        s = self.speculation
        catch_up = DraftForward(max(0.0, decoding) * (s.k + 1) + prompt_tokens, s.k + 1,
                                max(0.0, decoding) + prompts, True)
        if decoding <= 0:
            return [catch_up]
        rows = decoding * s.topk
        return [catch_up] + [DraftForward(rows, s.topk, rows, False)] * (s.k - 1)

    def draft_seconds(self, decoding: float, context: float, prompt_tokens: float = 0.0, chunk_tokens: float = 1.0,
                      chunk_context: float = 0.0) -> float:
        """The draft's forwards (draft_forwards) priced on the draft's own StepCost; the prompt tokens come as
        chunks of `chunk_tokens` over `chunk_context` earlier tokens each."""
        d, total = self.draft, 0.0
        prompts = prompt_tokens / chunk_tokens if prompt_tokens > 0 else 0.0
        for f in self.draft_forwards(decoding, prompt_tokens, prompts):
            if f.catch_up:
                attention = d.prefill_attention(f.per_request, context, decoding) if decoding > 0 else 0.0
                if prompts:
                    attention += d.prefill_attention(chunk_tokens, chunk_context, prompts)
            else:
                attention = d.decode_attention(max(1, round(f.rows)), round(context))
            total += _lerp(d.linear, f.rows) + d.logits(f.head_rows) + attention + d._sampling(f.head_rows)
        return total

    def steady(self, decoding: float, prefill_tokens: float, chunk_tokens: int, chunk_context: float,
               decode_context: float) -> float:
        """A speculative step: every decoding request's verified tokens (k + 1, a tree's N) and the prompt chunks in
        one target forward (StepCost.steady with that query), beside the draft's forwards (its proposals and its
        pass over the prompt tokens), and the host work an engine without its overlap scheduler runs in series
        (serial_host)."""
        sequences = decoding + (prefill_tokens / chunk_tokens if prefill_tokens > 0 else 0.0)
        return self.target.steady(decoding, prefill_tokens, chunk_tokens, chunk_context, decode_context,
                                  query=self.speculation.verify_tokens,
                                  draft_s=self.draft_seconds(decoding, decode_context, prefill_tokens, chunk_tokens,
                                                             chunk_context),
                                  host_in_series=self.host_in_series) + self.serial_host_s(sequences)

    def step(self, chunks: list[tuple[int, int]], decode_batch: int, decode_context: int) -> float:
        """The event simulator's step (serving/engine.py): `decode_batch` requests verify their tokens (k + 1, a
        tree's N) beside the prefill chunks [(tokens, context)]."""
        if not chunks:
            return self.steady(decode_batch, 0, 1, 0, decode_context)
        tokens = sum(n for n, _ in chunks)
        return self.steady(decode_batch, tokens, tokens / len(chunks), sum(c for _, c in chunks) / len(chunks),
                           decode_context)

    def accepted(self, rng) -> int:
        """Tokens one request gains in one step, drawn: the proposals accepted in a row (a tree's path, depth by
        depth), and the target's own."""
        gained = 1
        for i in range(self.speculation.depth):
            if rng.random() >= self.speculation.acceptance[min(i, len(self.speculation.acceptance) - 1)]:
                break
            gained += 1
        return gained

    def draft_memory(self) -> tuple[float, float]:
        """(weight bytes per GPU, KV bytes per token per GPU) the draft adds."""
        if self._draft_memory is None:
            d = self.draft
            if d is None:
                self._draft_memory = (0.0, 0.0)
            else:
                probe = trace(d.spec, Request(1, 1, 0), d.options)
                par = d.par
                weights = weight_bytes_per_gpu(probe, par.tp, par.ep, 1)
                if self.speculation.method == "mtp":   # embedding and head are the target's own
                    c = d.spec.config
                    tied = 1 if c.get("tie_word_embeddings") else 2
                    weights = max(0.0, weights - tied * d.vocab * d.hidden * 2 / par.tp)
                if self.speculation.method == "eagle3":   # the heads ship in bf16, split over TP as the layer is
                    weights += eagle3_fusion_params(d.spec.config) * 2 / par.tp
                self._draft_memory = (weights, kv_bytes_per_token(probe, par.tp))
        return self._draft_memory

    def replica_memory(self, max_batched_tokens: int, memory_fraction: float | None = None,
                       max_num_seqs: int | None = None) -> ReplicaMemory:
        """The target's memory, less the draft's weights, its KV per token and the verification's warm-up in the
        engine's memory profile (VERIFY_WARMUP_FP32_LOGITS, `max_num_seqs` rows: the engine's default unless
        given)."""
        mem = self.target.replica_memory(max_batched_tokens, memory_fraction)
        weights, kv = self.draft_memory()
        rows = max_num_seqs or self.defaults.max_num_seqs
        copies = VERIFY_WARMUP_FP32_LOGITS.get(self.target.engine, 0) if self.target.execution == ENGINE else 0
        warmup = copies * rows * self.target.vocab * 4
        if not weights and not kv and not warmup:
            return mem
        cache = max(0.0, mem.kv_cache - weights - warmup)
        per_token = mem.kv_bytes_per_token + kv
        return replace(mem, weights=mem.weights + weights, activations=mem.activations + warmup, kv_cache=cache,
                       kv_tokens=int(cache / per_token) if per_token > 0 else mem.kv_tokens,
                       kv_bytes_per_token=per_token)


@dataclass(frozen=True)
class StepTimes:
    """One speculative decode step of `batch` requests over `context` tokens each, beside the plain one."""
    batch: int
    context: int
    draft_s: float           # the draft's forwards (draft_forwards)
    verify_s: float          # the target's forward over the verified rows, its sampling and its step overheads
    plain_s: float           # the same batch's decode step without speculation
    tokens_per_step: float
    verify_tokens: int       # query rows per request of the verification
    serial_host_s: float = 0.0   # host work run in series with the GPU (an engine speculating without overlap)

    @property
    def step_s(self) -> float:
        return self.draft_s + self.verify_s + self.serial_host_s

    @property
    def tpot_s(self) -> float:
        """Time per output token: the step spread over the tokens it gains a request."""
        return self.step_s / self.tokens_per_step

    @property
    def speedup(self) -> float:
        """Output tokens/s speculating over not, at this batch."""
        return self.plain_s / self.tpot_s

    def as_json(self) -> dict:
        return {"batch": self.batch, "context": self.context, "draft_ms": self.draft_s * 1e3,
                "verify_ms": self.verify_s * 1e3, "serial_host_ms": self.serial_host_s * 1e3,
                "step_ms": self.step_s * 1e3,
                "tokens_per_step": self.tokens_per_step, "verify_tokens_per_request": self.verify_tokens,
                "effective_tpot_ms": self.tpot_s * 1e3, "plain_step_ms": self.plain_s * 1e3,
                "speedup": self.speedup}


def step_times(step: SpeculativeStep, batch: int, context: int) -> StepTimes:
    """A decode-only speculative step priced as the serving steps are (StepCost.steady: overheads included)."""
    total = step.steady(batch, 0, 1, 0, context)
    draft, host = step.draft_seconds(batch, context), step.serial_host_s(batch)
    return StepTimes(batch, context, draft, total - draft - host, step.target.steady(batch, 0, 1, 0, context),
                     step.tokens_per_step, step.speculation.verify_tokens, host)


def speedup_at_batch(step: SpeculativeStep, batch: int, context: float) -> float:
    """Output tokens/s of a decode batch of `batch` requests over `context` tokens each, speculating, relative to
    the same batch without: tokens per step over the speculative step's time, against one token per plain step."""
    return step_times(step, batch, round(context)).speedup


def speculative_step(target: StepCost, speculation: Speculation | None,
                     trust_remote_code: bool = False) -> StepCost | SpeculativeStep:
    """The target's step cost, speculating when `speculation` is given."""
    if speculation is None:
        return target
    spec = draft_spec(target.spec, speculation, trust_remote_code)
    draft = None if spec is None else StepCost(spec, target.hw, target.options, target.execution, target.par,
                                               target.engine)
    return SpeculativeStep(target, speculation, draft)


__all__ = ["METHODS", "DraftForward", "SerialHost", "SpeculativeStep", "Speculation", "StepTimes", "draft_spec",
           "eagle3_fusion_params", "mtp_layers", "parse_speculation", "serial_host", "sibling_miss",
           "speculative_step", "speedup_at_batch", "step_times", "tree_acceptance"]
