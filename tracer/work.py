"""The device-independent record of one forward step: ops with their FLOPs and bytes.

Nothing here knows about time. `cost/` turns a Trace into time for a given accelerator.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

GEMM, ATTENTION, OTHER = "gemm", "attention", "other"
OP_CLASSES = (GEMM, ATTENTION, OTHER)
MATRIX, VECTOR = "matrix", "vector"

# Fusion groups a serving engine merges into one kernel each (per layer instance).
FUSION_NORM, FUSION_ROTARY, FUSION_ACTIVATION, FUSION_RESIDUAL, FUSION_CAST = (
    "norm", "rotary", "activation", "residual", "cast")


@dataclass(frozen=True)
class GemmShape:
    """C[m, n] = A[m, k] @ B[k, n], `batch` times (bmm) or once."""
    m: int
    n: int
    k: int
    batch: int = 1


@dataclass(frozen=True)
class AttentionWork:
    """One fused attention core over `batch` sequences (scores, softmax, weighted sum)."""
    batch: int
    heads: int
    kv_heads: int
    qk_head_dim: int
    v_head_dim: int
    query_length: int
    context_length: int          # tokens already cached before this step
    window: int | None           # sliding window in keys (None: full causal)
    pairs_per_sequence: int      # executed query-key pairs per head per sequence
    kv_tokens_read: int          # keys read per sequence (per KV head)
    kv_shares_storage: bool = False  # MLA absorbed form: V is a slice of the cached K
    has_sinks: bool = False
    causal: bool = True              # False: every query sees every key (encoders, e.g. a vision tower)
    chunk: int | None = None         # chunked local attention (Llama-4): a query sees only its chunk's keys
    # MLA in the absorbed form: (qk, v) head dims of its expanded multi-head form (K-nope + rope, V per head),
    # the form serving engines prefill in (cost/engines.py MlaPrefill); None: not MLA
    expanded_head_dims: tuple[int, int] | None = None

    @property
    def chunk_binds(self) -> bool:
        """The step's keys span more than one chunk, so its queries see fewer keys than full causal attention's."""
        return bool(self.chunk) and self.context_length + self.query_length > self.chunk


@dataclass(frozen=True)
class ExpertsWork:
    """A routed-experts layer priced with expected balanced routing."""
    tokens: int
    num_experts: int
    top_k: int
    hidden_size: int
    intermediate_size: int
    gated: bool
    active_experts: float
    imbalance: float

    @property
    def up_width(self) -> int:
        """Output width of the up projection: gate and up stacked when the experts are gated."""
        return (2 if self.gated else 1) * self.intermediate_size

    @property
    def tokens_per_expert(self) -> float:
        return self.tokens * self.top_k / self.num_experts * self.imbalance


@dataclass(frozen=True)
class StateWork:
    """The core of a recurrent sequence mixer (SSM scan, linear attention, short convolution) over `tokens` new
    tokens per sequence, carrying a constant-size state per sequence from one step to the next."""
    kind: str                    # causal_conv1d | selective_scan | ssd | gated_delta_rule | kda | lightning | wkv
    batch: int
    tokens: int                  # new tokens per sequence
    matrix_flops: float          # on matrix units (chunked algorithms), whole batch
    vector_flops: float          # on vector units, whole batch
    state_elements: int          # per sequence
    state_element_size: float    # bytes
    reads_state: bool            # continues a cached state (context > 0); else starts from zero

    @property
    def state_bytes(self) -> float:
        """Per sequence: the state this op keeps between steps."""
        return self.state_elements * self.state_element_size


@dataclass(frozen=True)
class Op:
    name: str                  # aten op or tracecost op, e.g. "aten.mm", "tracecost.attention"
    op_class: str              # gemm | attention | other
    unit: str                  # matrix | vector
    flops: float
    bytes_read: float
    bytes_written: float
    dtype: str
    module: str                # owning module path, e.g. "model.layers.3.mlp.down_proj"
    module_type: str           # owning module class name
    shapes: tuple = ()         # input shapes
    out_shape: tuple = ()
    count: int = 1             # how many identical layers this op stands for
    layer: int | None = None   # decoder layer index (representative) or None
    fusion_group: str | None = None
    weight_bytes: float = 0.0  # bytes of parameters this op reads
    tp_sharded: bool = False   # work splits across tensor-parallel ranks
    gemm: GemmShape | None = None
    attention: AttentionWork | None = None
    experts: ExpertsWork | None = None
    state: StateWork | None = None   # recurrent mixers (SSM / linear attention / short conv)
    # bytes when the op runs inside its fused group (engine mode); None: same as unfused
    fused_bytes: float | None = None
    # instance key of the fused kernel this op belongs to (layer, module instance, group)
    fusion_key: str | None = None
    kv_cache_write: bool = False
    broadcast: bool = False    # an input is broadcast to the output shape (no vectorized fast path)
    source: int | None = None  # index of the op that produced the first activation input (GEMM merging)
    weight_operand: str | None = None  # "param" / "buffer": a GEMM operand is a weight (view or cast included)
    weight_module: str | None = None   # GEMMs: the module holding the weight (kv_b_proj for MLA's absorbed bmm)
    weight_role: str | None = None     # GEMMs: linear | experts | router | lm_head | mla_absorbed (weight_formats.py)
    weight_format: str | None = None   # GEMMs: the checkpoint's format of that weight (bf16, fp8_block, mxfp4, ...)

    @property
    def bytes(self) -> float:
        return self.bytes_read + self.bytes_written

    def times(self, count: int) -> "Op":
        return replace(self, count=count)


@dataclass(frozen=True)
class Request:
    """One forward step: `num_queries` sequences of `query_length` new tokens over `context_length` cached."""
    num_queries: int
    query_length: int
    context_length: int = 0
    decode: bool = False
    all_logits: bool = False

    @property
    def seq_len(self) -> int:
        return self.context_length + self.query_length

    @property
    def tokens(self) -> int:
        return self.num_queries * self.query_length


@dataclass(frozen=True)
class TraceOptions:
    dtype: str = "auto"                    # auto: bf16, or the weight format of the config's quantization_config
    kv_cache_dtype: str | None = None      # None: same as dtype
    mla_form: str = "absorbed"             # absorbed (engine) | hf (re-expand latent cache each step)
    moe_imbalance: float = 1.0
    dedup_layers: bool = True
    trust_remote_code: bool = False
    image_tokens: int = 0                  # image tokens counted as prefill input (multimodal configs)


@dataclass
class Trace:
    model: str
    request: Request
    options: TraceOptions
    ops: list[Op]
    params: int
    active_params: int
    num_layers: int
    kv_bytes_per_token: float      # whole model, all layers, at the KV cache dtype
    weight_bytes: float            # all parameters at the weight dtype
    trace_seconds: float = 0.0
    kv_element_size: float = 2.0
    hidden_size: int = 0
    unformulated: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # recurrent layers: state bytes per sequence, whole model (constant in length; KV grows only in attention layers)
    state_bytes_per_sequence: float = 0.0
    image_tokens: int = 0                   # of the query tokens, how many are image tokens
    checks: dict[str, str] = field(default_factory=dict)  # self-checks run on this trace and their verdicts
    recomputes_context: bool = False        # no KV cache: the step's ops are the forward of context + query tokens
    architecture: str = ""                  # the config's model class (architectures[0]): engines pick kernels by it

    def total(self, attr: str, op_class: str | None = None) -> float:
        return sum(getattr(op, attr) * op.count for op in self.ops
                   if op_class is None or op.op_class == op_class)

    @property
    def flops(self) -> float:
        return self.total("flops")

    @property
    def bytes(self) -> float:
        return self.total("bytes")

    def flops_by_class(self) -> dict[str, float]:
        return {c: self.total("flops", c) for c in OP_CLASSES}

    def bytes_by_class(self) -> dict[str, float]:
        return {c: self.total("bytes", c) for c in OP_CLASSES}

    @property
    def num_ops(self) -> int:
        return sum(op.count for op in self.ops)
