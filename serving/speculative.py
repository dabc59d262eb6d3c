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
prefill chunk); each further proposal is a one-token decode. Its weights and KV count against the replica's
memory. Acceptance is an input (serving/data/speculative.json holds published defaults, each with its source).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources

from tracer.model_source import ModelSpec, resolve_model
from tracer.trace import trace
from tracer.work import Request

from .capacity import ReplicaMemory, kv_bytes_per_token, weight_bytes_per_gpu
from .step_cost import StepCost, _lerp

EAGLE3_VOCAB = 32000     # the draft vocabulary of the published EAGLE-3 heads (draft_vocab_size)
# engines that cap the running batch when they speculate, unless told otherwise: SGLang resets
# max_running_requests to 48 for EAGLE, EAGLE3 and NEXTN (python/sglang/srt/server_args.py)
SPECULATIVE_MAX_RUNNING = {"sglang": 48}
MAX_K = 16


@lru_cache(maxsize=1)
def _defaults() -> dict:
    return json.loads((resources.files("serving") / "data" / "speculative.json").read_text())


@dataclass(frozen=True)
class Speculation:
    method: str                       # mtp | eagle3 | draft | ngram
    k: int                            # tokens the draft proposes per step
    acceptance: tuple[float, ...]     # P(i-th proposal accepted | the ones before were); the last one repeats
    source: str                       # where the acceptance comes from
    draft_model: str | None = None    # draft:MODEL

    def accepted_through(self, i: int) -> float:
        """P(the first i proposals are all accepted)."""
        p = 1.0
        for j in range(i):
            p *= self.acceptance[min(j, len(self.acceptance) - 1)]
        return p

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens a request gains per step: the accepted proposals and the target's own next token."""
        return 1.0 + sum(self.accepted_through(i) for i in range(1, self.k + 1))

    @property
    def label(self) -> str:
        name = f"draft:{self.draft_model}" if self.method == "draft" else self.method
        return f"{name} k={self.k}"

    def describe(self) -> str:
        rates = ", ".join(f"{a:.3g}" for a in self.acceptance[:self.k])
        return (f"speculative decoding: {self.label}, {self.tokens_per_step:.2f} tokens per step "
                f"(acceptance {rates} per position; {self.source})")


METHODS = ("mtp", "eagle3", "ngram", "draft:MODEL")


def parse_speculation(method: str, k: int = 1, acceptance_rate: float | None = None,
                      acceptance_length: float | None = None) -> Speculation:
    """A speculation setup from the CLI's words; ValueError (one line) for anything inconsistent."""
    name, _, draft = method.strip().partition(":")
    name = name.lower()
    if name not in ("mtp", "eagle3", "ngram", "draft") or (name == "draft") != bool(draft):
        raise ValueError(f"unknown speculative method '{method}' (choose from {', '.join(METHODS)})")
    if not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise ValueError(f"--num-speculative-tokens must be an integer in 1..{MAX_K}, got {k}")
    if acceptance_rate is not None and acceptance_length is not None:
        raise ValueError("give --acceptance-rate or --acceptance-length, not both")
    if acceptance_rate is not None:
        if not 0.0 < acceptance_rate < 1.0:
            raise ValueError(f"--acceptance-rate must be in (0, 1), got {acceptance_rate}")
        return Speculation(name, k, (acceptance_rate,), "acceptance rate as given", draft or None)
    if acceptance_length is not None:
        if not 1.0 < acceptance_length < k + 1:
            raise ValueError(f"--acceptance-length must be in (1, {k + 1}) for k = {k} (mean tokens per step, the "
                             f"target's own included), got {acceptance_length}")
        rate = _rate_for_length(acceptance_length, k)
        return Speculation(name, k, (rate,), f"acceptance length {acceptance_length:g} as given", draft or None)
    entry = _defaults().get(name)
    if entry is None:
        raise ValueError(f"'{name}' speculation has no published default acceptance (it depends on the draft and "
                         f"the workload): pass --acceptance-rate or --acceptance-length")
    return Speculation(name, k, tuple(entry["acceptance"]), f"default: {entry['source']}", draft or None)


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
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
              "num_hidden_layers": 1, "num_attention_heads": heads,
              "num_key_value_heads": int(c.get("num_key_value_heads") or heads),
              "head_dim": int(c.get("head_dim") or hidden // heads),
              "intermediate_size": int(c.get("intermediate_size") or 4 * hidden), "vocab_size": EAGLE3_VOCAB,
              "max_position_embeddings": int(c.get("max_position_embeddings") or 131072),
              "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16", "tie_word_embeddings": False}
    return ModelSpec(f"{target.name} EAGLE-3 head", config, "an EAGLE-3 head: one Llama layer of the target's width")


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
    "eagle3": "EAGLE-3's feature fusion (3h -> h) and its layer's 2h-wide attention input are priced as one Llama "
              "layer of width h",
    "draft": "the draft model runs with the target's tensor parallelism",
    "ngram": "n-gram lookup runs on the host; its time is not priced",
}


class SpeculativeStep:
    """Step times and memory of a replica that speculates: the target's StepCost and the draft's (None: n-gram).
    Offers StepCost's interface, so the steady state, the search and the simulator price it the same way."""

    def __init__(self, target: StepCost, speculation: Speculation, draft: StepCost | None):
        self.target, self.speculation, self.draft = target, speculation, draft
        self.tokens_per_step = speculation.tokens_per_step
        self._draft_memory: tuple[float, float] | None = None

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
        return self.target.formats_notes() + [self.speculation.describe(), DRAFT_NOTES[self.speculation.method]]

    def draft_seconds(self, decoding: float, context: float) -> float:
        """The draft's forwards for `decoding` requests: a catch-up over the k + 1 tokens the last step
        verified, then k - 1 one-token proposals, each sampled greedily."""
        d = self.draft
        if d is None or decoding <= 0:
            return 0.0
        q, k = self.speculation.k + 1, self.speculation.k
        n = max(1, round(decoding))
        first = _lerp(d.linear, decoding * q) + d.logits(decoding) + d.prefill_attention(q, context, decoding)
        rest = (k - 1) * (_lerp(d.linear, decoding) + d.logits(decoding) + d.decode_attention(n, round(context)))
        return first + rest + k * d._sampling(decoding)

    def steady(self, decoding: float, prefill_tokens: float, chunk_tokens: int, chunk_context: float,
               decode_context: float) -> float:
        """A speculative step: every decoding request's k + 1 verified tokens and the prompt chunks in one target
        forward (StepCost.steady with that query), beside the draft's proposals."""
        return self.target.steady(decoding, prefill_tokens, chunk_tokens, chunk_context, decode_context,
                                  query=self.speculation.k + 1, draft_s=self.draft_seconds(decoding, decode_context))

    def step(self, chunks: list[tuple[int, int]], decode_batch: int, decode_context: int) -> float:
        """The event simulator's step (serving/engine.py): `decode_batch` requests verify k + 1 tokens each
        beside the prefill chunks [(tokens, context)]."""
        if not chunks:
            return self.steady(decode_batch, 0, 1, 0, decode_context)
        tokens = sum(n for n, _ in chunks)
        return self.steady(decode_batch, tokens, tokens / len(chunks), sum(c for _, c in chunks) / len(chunks),
                           decode_context)

    def accepted(self, rng) -> int:
        """Tokens one request gains in one step, drawn: the proposals accepted in a row, and the target's own."""
        gained = 1
        for i in range(self.speculation.k):
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
                self._draft_memory = (weights, kv_bytes_per_token(probe, par.tp))
        return self._draft_memory

    def replica_memory(self, max_batched_tokens: int, memory_fraction: float | None = None) -> ReplicaMemory:
        mem = self.target.replica_memory(max_batched_tokens, memory_fraction)
        weights, kv = self.draft_memory()
        if not weights and not kv:
            return mem
        cache = max(0.0, mem.kv_cache - weights)
        per_token = mem.kv_bytes_per_token + kv
        return replace(mem, weights=mem.weights + weights, kv_cache=cache,
                       kv_tokens=int(cache / per_token) if per_token > 0 else mem.kv_tokens,
                       kv_bytes_per_token=per_token)


def speculative_step(target: StepCost, speculation: Speculation | None,
                     trust_remote_code: bool = False) -> StepCost | SpeculativeStep:
    """The target's step cost, speculating when `speculation` is given."""
    if speculation is None:
        return target
    spec = draft_spec(target.spec, speculation, trust_remote_code)
    draft = None if spec is None else StepCost(spec, target.hw, target.options, target.execution, target.par,
                                               target.engine)
    return SpeculativeStep(target, speculation, draft)


__all__ = ["METHODS", "SpeculativeStep", "Speculation", "draft_spec", "mtp_layers", "parse_speculation",
           "speculative_step"]
