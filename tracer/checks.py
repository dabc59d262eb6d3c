"""Checks that run on every trace, so that a number tracecost cannot stand behind is never printed silently.

- FLOP identity: the traced GEMM FLOPs equal, weight by weight, 2 x rows x parameters: every decoder weight
  meets every token once (routed experts: top_k / E of them), the LM head meets the rows whose logits are
  computed. It fails when layers are skipped or counted twice, when experts run dense, when attention or a
  recurrent mixer is computed as plain matrix products, or when the LM head runs on every token.
- Attention sees the cache: every causal attention op attends over the request's whole context, and every
  recurrent op continues a cached state when there is context; a trace with neither op mixes no tokens.
- Layer dedup self-test: the first time a model class (with a given layer pattern) is traced, a short prefill over
  a cached context is traced with and without dedup; any difference turns dedup off for that class (and says so).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from . import disk_cache
from .layers import DEDUP, PROBE
from .model_source import ModelError
from .patches import RELATIVE_POSITION_SCORES, RELATIVE_POSITION_WEIGHTS
from .work import GEMM, Request, Trace

if TYPE_CHECKING:
    from .build import BuiltModel

IDENTITY_TOLERANCE = 1e-6


@dataclass
class Identity:
    traced: float                  # GEMM FLOPs in the trace (text decoder and LM head)
    expected: float                # 2 x rows x parameters, weight by weight
    weightless: float = 0.0        # GEMM FLOPs of ops that read no weight (activations times activations)
    weightless_modules: list[str] = field(default_factory=list)
    unread_params: int = 0         # matrix parameters no op read (e.g. cross-attention without an encoder)
    cache_weights: list[str] = field(default_factory=list)  # weights multiplied with every cached token
    mixing: float = 0.0            # FLOPs of tiny per-token products without a weight (outside the identity)
    largest_gap: tuple | None = None  # (module, expected minus traced FLOPs) where the two differ most
    reused_weights: list[str] = field(default_factory=list)  # weights a layer applies more than once per step
    per_head_weights: list[str] = field(default_factory=list)  # weights applied to every head of every token
    position_weights: list[str] = field(default_factory=list)  # weights applied to a relative-distance table

    @property
    def holds(self) -> bool:
        return abs(self.traced - self.expected) <= IDENTITY_TOLERANCE * max(self.expected, 1.0)

    def describe(self) -> str:
        diff = self.traced / self.expected - 1 if self.expected else float("inf")
        text = (f"traced GEMM FLOPs {self.traced:.4g} != 2 x params x rows {self.expected:.4g} "
                f"({diff * 100:+.2f}%)")
        if self.largest_gap:
            module, gap = self.largest_gap
            text += f"; largest gap in {module or 'the model'}: {-gap:+.3g} FLOPs traced beyond its weights' share"
        if self.weightless:
            text += (f"; {self.weightless:.3g} FLOPs of matrix products read no weight (in "
                     f"{', '.join(sorted(set(self.weightless_modules))[:3])}): attention or a mixer computed "
                     f"as plain matmuls")
        return text


def _top_k(config) -> int | None:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for name in ("num_experts_per_tok", "moe_top_k", "moe_topk", "top_k", "num_experts_per_token", "moe_k"):
        value = getattr(text, name, None)
        if isinstance(value, int) and value > 0:
            return value
    ffn = getattr(text, "ffn_config", None)
    value = getattr(ffn, "moe_top_k", None) if ffn is not None else None
    return value if isinstance(value, int) else None


def _module_of(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else ""


def _text_scope(built: BuiltModel) -> tuple[str | None, str | None]:
    """(decoder path, LM head path) for multimodal models, whose vision tower the identity does not cover."""
    if not built.multimodal:
        return None, None
    model = built.model
    paths = built.tree.paths
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return paths.get(id(decoder)), paths.get(id(head))


def flop_identity(built: BuiltModel, params_read: dict[int, set], param_rows: dict[int, list], ops, tokens: int,
                  logits_rows: int, cache_rows: int, expert_params: dict[int, tuple] | None = None) -> Identity:
    """`tokens`: rows through the decoder; `logits_rows`: rows through the LM head; `cache_rows`: cached plus new
    tokens of all sequences. Every decoder weight is expected to meet `tokens` rows (a routed expert's weights
    top_k / E of them); weights after the decoder (the LM head and a prediction head around it) the logits rows.
    A decoder weight that meets every cached token instead (HF's MLA form, Doge's dynamic mask) is accepted and
    named in a note."""
    from .build import _expert_tensors
    model, layers = built.model, built.layers
    decoder_path, head_path = _text_scope(built)
    paths, modules = built.tree.paths, built.tree.by_path

    def in_scope(path: str) -> bool:
        if decoder_path is None:
            return True
        return path == head_path or path == decoder_path or path.startswith(decoder_path + ".") or decoder_path == ""

    layer_re = re.compile(r"^" + re.escape(layers.path) + r"\.(\d+)\.(.*)$")
    names: dict[int, list[str]] = {}
    by_name = {}
    for name, p in built.tree.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
        by_name[name] = p
    params = {id(p): p for p in by_name.values()}
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head_weight = getattr(head, "weight", None) if head is not None else None
    head_id = id(head_weight) if head_weight is not None and id(head_weight) in params else None
    top_k = {op.module: op.experts.top_k for op in ops if op.experts is not None}
    default_k = _top_k(built.config)

    def resolved(name: str, pid: int) -> int:
        """The parameter whose reads stand for this one: the same name in the layer's group representative."""
        m = layer_re.match(name)
        if m and int(m.group(1)) in layers.replay:
            rep = f"{layers.path}.{layers.replay[int(m.group(1))]}.{m.group(2)}"
            if rep in by_name:
                return id(by_name[rep])
        return pid

    def representative(path: str) -> str:
        m = layer_re.match(path + ".x")
        if m and int(m.group(1)) in layers.replay:
            return f"{layers.path}.{layers.replay[int(m.group(1))]}.{m.group(2)[:-2]}"
        return path

    # rows of the relative-position table per module: [R distances, B sequences, ...] keys of its position scores
    distances = {op.module: op.shapes[1][0] * op.shapes[1][1] for op in ops if op.name == RELATIVE_POSITION_SCORES}
    expected, unread, cache_weights, reused, per_head, position_weights = 0.0, 0, [], [], [], []
    by_module: dict[str, float] = {}  # expected minus traced FLOPs per module (the largest gap is reported)
    for pid, p in params.items():
        if p.dim() < 2:
            continue
        if pid == head_id:
            if GEMM in params_read.get(pid, set()):
                expected += 2.0 * logits_rows * p.numel()
                by_module[paths.get(id(head), "")] = 2.0 * logits_rows * p.numel()
            continue
        for name in names[pid]:
            path = _module_of(name)
            if not in_scope(path):
                continue
            rid = resolved(name, pid)
            classes = params_read.get(rid, set())
            if GEMM not in classes:
                if not classes and p.dim() == 2:
                    unread += p.numel()
                continue
            owner = modules[path] if path else model
            seen = param_rows.get(rid, [])
            rows = float(tokens)
            if (expert_params or {}).get(rid):  # read by a routed-experts op: top_k of its E experts
                k, n, uses = expert_params[rid]
                n = p.shape[0] if p.dim() == 3 else n  # LongCat stores gate_up for its zero experts too
                rows = tokens * min(k, n) / n * uses
                if uses > 1:
                    reused.append(path.rsplit(".", 1)[-1])
            elif _expert_tensors(owner) and p.dim() == 3:
                k = top_k.get(representative(path), default_k)
                if not k:
                    raise ModelError(f"{type(owner).__name__}: routed experts without a known top-k: the FLOP "
                                     f"identity cannot be checked")
                rows = tokens * min(k, p.shape[0]) / p.shape[0]
            elif seen and abs(sum(seen) - tokens) < 0.5:
                rows = float(tokens)        # one use, or one use split over views (MLA's absorbed halves)
            elif seen and all(abs(r - tokens) < 0.5 for r in seen):
                rows = float(tokens) * len(seen)  # applied more than once per step (Gemma-3n's AltUp router, HRM)
                reused.append(path.rsplit(".", 1)[-1])
            elif not path.startswith(layers.path + ".") and seen and all(abs(r - logits_rows) < 0.5 for r in seen):
                rows = float(logits_rows) * len(seen)  # one row per sequence outside the layers: BERT's head, pooler
            elif cache_rows != tokens and seen and all(abs(r - cache_rows) < 0.5 for r in seen):
                rows = float(cache_rows) * len(seen)
                cache_weights.append(path.rsplit(".", 1)[-1])
            elif seen and name.rsplit(".", 1)[-1] in RELATIVE_POSITION_WEIGHTS.get(type(owner).__name__, ()) \
                    and all(abs(r - distances.get(representative(path), -1)) < 0.5 for r in seen):
                rows = float(distances[representative(path)])  # the relative distances of each sequence (XLNet's r)
                position_weights.append(path.rsplit(".", 1)[-1] + "." + name.rsplit(".", 1)[-1])
            elif seen and _heads(model, path) and all(abs(r - tokens * _heads(model, path)) < 0.5 for r in seen):
                rows = float(tokens) * _heads(model, path) * len(seen)  # shared by the heads (Inkling's rel. logits)
                per_head.append(path.rsplit(".", 1)[-1])
            expected += 2.0 * rows * p.numel()
            by_module[representative(path)] = by_module.get(representative(path), 0.0) + 2.0 * rows * p.numel()
    traced = weightless = mixing = 0.0
    weightless_modules = []
    for op in ops:
        if op.op_class != GEMM or not in_scope(op.module):
            continue
        if op.weight_operand == "buffer":  # position encodings (inv_freq x positions): not a weight of the model
            continue
        if op.name == RELATIVE_POSITION_SCORES:  # queries x position keys: attention-core work, like q . k
            continue
        if op.weight_operand is None and op.experts is None and _per_token_mixing(op, tokens):
            mixing += op.flops * op.count
            continue
        traced += op.flops * op.count
        by_module[op.module] = by_module.get(op.module, 0.0) - op.flops * op.count
        if op.weight_operand is None and op.experts is None:
            weightless += op.flops * op.count
            weightless_modules.append(op.module_type)
    gap = max(by_module.items(), key=lambda kv: abs(kv[1]), default=("", 0.0))
    return Identity(traced=traced, expected=expected, weightless=weightless, weightless_modules=weightless_modules,
                    unread_params=unread, cache_weights=sorted(set(cache_weights)), mixing=mixing,
                    reused_weights=sorted(set(reused)), per_head_weights=sorted(set(per_head)),
                    position_weights=sorted(set(position_weights)),
                    largest_gap=gap if abs(gap[1]) > IDENTITY_TOLERANCE * max(expected, 1.0) else None)


def _heads(model, path: str) -> int:
    """Attention heads of the module owning `path` or its parent (0 when neither has any)."""
    parts = path.split(".")
    for end in (len(parts) - 1, len(parts) - 2):
        if end <= 0:
            continue
        owner = model.get_submodule(".".join(parts[:end]))
        heads = getattr(owner, "num_heads", None) or getattr(owner, "num_attention_heads", None)
        if isinstance(heads, int) and heads > 1:
            return heads
    return 0


def _per_token_mixing(op, tokens: int) -> bool:
    """A tiny product inside each token (Gemma-3n's AltUp: [hidden, 4] x [4, 4] per token): no weight, no sequence
    mixing. Attention computed as matmuls is batched over heads and contracts or spans the keys: never this."""
    g = op.gemm
    return g is not None and g.batch == tokens and max(g.n, g.k) <= 16


def context_problems(ops, request: Request) -> list[str]:
    """Attention that does not see the cache, recurrent layers that do not continue their state, or no sequence
    mixing at all (a mixer computed elementwise, which the FLOP identity cannot see: it has no weights)."""
    if not any(op.attention is not None or op.state is not None for op in ops):
        return ["no attention or recurrent op was traced, so the mixing across tokens is not priced"]
    problems = []
    for op in ops:
        w = op.attention
        if w is not None and w.causal and w.context_length != request.context_length:
            problems.append(f"attention in {op.module} sees {w.context_length} cached tokens, not "
                            f"{request.context_length}")
        s = op.state
        if s is not None and request.context_length > 0 and not s.reads_state:
            problems.append(f"{op.name} in {op.module} starts from an empty state although {request.context_length} "
                            f"tokens are cached")
    return problems[:3]


# --- layer dedup self-test -------------------------------------------------------------------------------------------

_VERDICTS: dict = {}


def self_test_context(config) -> int:
    """A context longer than every window and chunk of the config, so layers that differ only there differ."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    longest = 0
    for key, value in vars(text).items():
        if ("window" in key or "attention_chunk" in key) and isinstance(value, int) and not isinstance(value, bool):
            longest = max(longest, value)
    return min(max(longest + 3, 40), 1 << 17)


def _totals(t: Trace) -> tuple:
    return (t.flops_by_class(), t.bytes_by_class(), t.num_ops)


def _differs(a: tuple, b: tuple) -> str | None:
    for name, x, y in (("FLOPs", a[0], b[0]), ("bytes", a[1], b[1])):
        for cls in x:
            if abs(x[cls] - y[cls]) > 1e-9 * max(abs(x[cls]), abs(y[cls]), 1.0):
                return f"{cls} {name} {x[cls]:.6g} with dedup vs {y[cls]:.6g} tracing the repeats"
    if a[2] != b[2]:
        return f"{a[2]} ops with dedup vs {b[2]} tracing the repeats"
    return None


def dedup_verdict(built: BuiltModel, run: Callable[[Request, str], Trace]) -> str:
    """'ok', or why dedup is off: runs the self-test once per model class and layer pattern (memory and disk).

    The test traces a short prefill with dedup and in probe mode, where the second and the last member of every
    group are traced too: a layer whose work differs from its group's first (a first-layer special case, shared
    KV in the last layers) shows as a difference."""
    groups = built.layers.groups
    if all(len(g) == 1 for g in groups):
        return "ok"
    pattern = tuple(next(k for k, g in enumerate(groups) if i in g) for i in range(built.num_layers))
    key = ("dedup-self-test", type(built.model).__module__, type(built.model).__qualname__, pattern)
    if key in _VERDICTS:
        return _VERDICTS[key]
    verdict = disk_cache.load(key, kind="verdicts")
    if verdict is None:
        # a short prefill over a cached context: every layer kind takes its continuing path (cache, state)
        request = Request(1, 5, self_test_context(built.config))
        problem = _differs(_totals(run(request, DEDUP)), _totals(run(request, PROBE)))
        verdict = "ok" if problem is None else (f"layer dedup self-test failed for {type(built.model).__name__} "
                                                f"({problem})")
        disk_cache.store(key, verdict, kind="verdicts")
    _VERDICTS[key] = verdict
    return verdict
