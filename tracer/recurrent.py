"""Recurrent sequence mixers as single ops with exact work: SSM scans, linear attention, short convolutions.

transformers routes these kernels through module-level functions of each modeling file
(`causal_conv1d_fn`, `mamba_selective_scan`, `mamba2_chunk_scan`, `torch_chunk_gated_delta_rule`,
`chunk_kimi_delta_attention`, `rwkv_linear_attention`, ...). During a traced forward those names are
bound to the functions below (see `patches.py`): each records ONE op with the work of the fused
kernel a serving engine runs, and returns empty tensors of the right shapes.

Work per sequence, T new tokens, chunk size c; pairs = causal query-key pairs inside chunks,
sum over chunks n(n+1)/2 (chunks start at the step's first token, after the cached state):
- causal_conv1d (D channels, width K): 2K vector FLOPs per token and channel (+4 for the activation);
  state: the last K-1 inputs per channel.
- selective_scan (Mamba-1, D channels, N states): per token and channel 8N + 10 vector FLOPs
  (discretize, update, read out, D skip, z gate); state D x N.
- ssd (Mamba-2 chunked scan, H heads of P dims, G groups, N states): matrix 2 pairs (H P + G N)
  (intra-chunk C B^T and its product with x) + 4 T H P N (chunk states and their read-out); state H P N.
  One decode token is the recurrent update, 5 H P N vector FLOPs.
- gated_delta_rule / kda (H heads, key dim dk, value dim dv, chunked WY form): matrix
  pairs (6 dk + 4 dv) + 6 T dk dv + chunks c^3/3 per head; one decode token 7 dk dv vector FLOPs per head
  (decay, k^T S, delta, rank-1 update, q^T S); KDA's per-channel decay adds 2 T dk vector FLOPs per head.
  State H dk dv.
- lightning (MiniMax linear attention with decay, H heads of d dims, blocks of c): matrix
  4 pairs d + 4 T d^2 per head; one decode token 5 d^2 vector FLOPs per head. State H d^2.
- wkv (RWKV-4 time mixing, C channels): 20 vector FLOPs per token and channel; state 3 C (+ shift states).
- mlstm (xLSTM, H heads, dk, dv, chunks of c): matrix 2 pairs (dk + dv) + 4 T dk dv per head; one decode token
  5 dk dv + 6 dk vector FLOPs per head. State H (dk dv + dk + 1).
- rglru (RecurrentGemma's RG-LRU, width W): 3 vector FLOPs per token and channel; state W.

Bytes: the inputs and outputs once, plus the state read when it continues a cached one and written once.
States are kept at the activation dtype (bf16 unless fp32 is traced).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .work import ATTENTION, MATRIX, OTHER, VECTOR, StateWork

if TYPE_CHECKING:
    import torch


def chunk_pairs(tokens: int, chunk: int) -> int:
    """Causal pairs inside chunks of `chunk` tokens: sum over chunks n(n+1)/2."""
    full, last = divmod(tokens, max(1, chunk))
    return full * chunk * (chunk + 1) // 2 + last * (last + 1) // 2


def chunk_cubes(tokens: int, chunk: int) -> float:
    """Triangular solves of the WY form: n^3/3 per chunk of n tokens."""
    full, last = divmod(tokens, max(1, chunk))
    return (full * chunk ** 3 + last ** 3) / 3.0


# --- work formulas (per sequence); the cross-check formulas use these same functions -------------------------------

def conv1d_flops(tokens: int, channels: int, width: int, activation: bool) -> float:
    return tokens * channels * (2.0 * width + (4.0 if activation else 0.0))


def selective_scan_flops(tokens: int, channels: int, states: int) -> float:
    return tokens * channels * (8.0 * states + 10.0)


def ssd_flops(tokens: int, heads: int, head_dim: int, groups: int, states: int, chunk: int) -> tuple[float, float]:
    """(matrix, vector) FLOPs of Mamba-2's scan for one sequence."""
    if tokens == 1:
        return 0.0, heads * head_dim * (5.0 * states + 4.0)
    pairs = chunk_pairs(tokens, chunk)
    matrix = 2.0 * pairs * (heads * head_dim + groups * states) + 4.0 * tokens * heads * head_dim * states
    return matrix, pairs * heads + 6.0 * tokens * heads * head_dim


def delta_rule_flops(tokens: int, heads: int, key_dim: int, value_dim: int, chunk: int,
                     channel_decay: bool = False) -> tuple[float, float]:
    """(matrix, vector) FLOPs of a gated delta rule (Gated DeltaNet; KDA with per-channel decay)."""
    extra = 2.0 * tokens * key_dim * heads if channel_decay else 0.0
    if tokens == 1:
        return 0.0, heads * (7.0 * key_dim * value_dim + 4.0 * (key_dim + value_dim)) + extra
    pairs = chunk_pairs(tokens, chunk)
    matrix = heads * (pairs * (6.0 * key_dim + 4.0 * value_dim) + 6.0 * tokens * key_dim * value_dim
                      + chunk_cubes(tokens, chunk))
    vector = heads * (2.0 * pairs + 8.0 * tokens * (key_dim + value_dim)) + extra
    return matrix, vector


def lightning_flops(tokens: int, heads: int, head_dim: int, block: int) -> tuple[float, float]:
    if tokens == 1:
        return 0.0, 5.0 * heads * head_dim * head_dim
    pairs = chunk_pairs(tokens, block)
    return (heads * (4.0 * pairs * head_dim + 4.0 * tokens * head_dim * head_dim),
            heads * (pairs + 2.0 * tokens * head_dim))


def wkv_flops(tokens: int, channels: int) -> float:
    return 20.0 * tokens * channels


def mlstm_flops(tokens: int, heads: int, key_dim: int, value_dim: int, chunk: int) -> tuple[float, float]:
    """xLSTM's mLSTM (a gated linear attention with a normalizer): chunkwise like lightning attention with
    separate key and value dims; one decode token updates C (dk x dv) and n (dk) and reads them with q."""
    if tokens == 1:
        return 0.0, heads * (5.0 * key_dim * value_dim + 6.0 * key_dim)
    pairs = chunk_pairs(tokens, chunk)
    return (heads * (2.0 * pairs * (key_dim + value_dim) + 4.0 * tokens * key_dim * value_dim),
            heads * (2.0 * pairs + 6.0 * tokens * key_dim))


# --- recording -------------------------------------------------------------------------------------------------------

def _record(kind: str, op_class: str, batch: int, tokens: int, matrix: float, vector: float, state_elements: int,
            inputs: list, outputs: list, reads_state: bool) -> None:
    from .recorder import active_recorder, tensor_bytes
    rec = active_recorder()
    if rec is None:
        return
    act = next((t for t in inputs if t is not None and t.is_floating_point()), None)
    element = min(act.element_size(), 4) if act is not None else 2
    work = StateWork(kind=kind, batch=batch, tokens=tokens, matrix_flops=matrix * batch, vector_flops=vector * batch,
                     state_elements=int(state_elements), state_element_size=element, reads_state=reads_state)
    tensors = [t for t in inputs if t is not None]
    state = batch * work.state_bytes
    read = sum(tensor_bytes(t) for t in tensors) + (state if reads_state else 0.0)
    written = sum(tensor_bytes(t) for t in outputs) + state
    unit = MATRIX if work.matrix_flops >= work.vector_flops else VECTOR
    rec.record(f"tracecost.{kind}", op_class, unit, work.matrix_flops + work.vector_flops, tensors, outputs,
               bytes_read=read, bytes_written=written, state=work)


def _continues(state) -> bool:
    """Whether a kernel continues a cached state: the tracer's request has context before this step."""
    from .recorder import active_recorder
    rec = active_recorder()
    return state is not None and rec is not None and rec.context_length > 0


# --- replacements for transformers' kernel functions (same signatures) ---------------------------------------------

def causal_conv1d_fn(hidden_states, weight, bias=None, activation=None, **kwargs):
    """[B, D, L] through a depthwise causal convolution of width K ([D, K] weight)."""
    batch, channels, length = hidden_states.shape
    width = weight.shape[-1]
    out = hidden_states.new_empty(batch, channels, length)
    from .recorder import active_recorder
    rec = active_recorder()
    reads = rec is not None and rec.context_length > 0
    _record("causal_conv1d", OTHER, batch, length, 0.0, conv1d_flops(length, channels, width, activation is not None),
            channels * (width - 1), [hidden_states, weight, bias], [out], reads)
    return out


def causal_conv1d_update(hidden_states, conv_state, weight, bias=None, activation=None, *args, **kwargs):
    batch, channels, length = hidden_states.shape
    width = weight.shape[-1]
    out = hidden_states.new_empty(batch, channels, length)
    _record("causal_conv1d", OTHER, batch, length, 0.0, conv1d_flops(length, channels, width, activation is not None),
            channels * (width - 1), [hidden_states, weight, bias], [out], True)
    return out


def mamba_selective_scan(hidden_states, dt, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                         return_last_state=False, *args, **kwargs):
    """Mamba-1 scan over u [B, D, L] (D may span several heads); state [B, D, N]."""
    batch, length = hidden_states.shape[0], hidden_states.shape[-1]
    channels = hidden_states.numel() // (batch * length)
    states = A.shape[-1]
    out = hidden_states.new_empty(hidden_states.shape)
    _record("selective_scan", ATTENTION, batch, length, 0.0, selective_scan_flops(length, channels, states),
            channels * states, [hidden_states, dt, B, C, z], [out], _continues(True))
    if return_last_state:
        return out, hidden_states.new_empty(*hidden_states.shape[:-1], states)
    return out


def mamba_selective_state_update(state, hidden_states, dt, A, B, C, D=None, *args, **kwargs):
    """One decode token: x [B, D] (or [B, H, P]) against state [B, D, N]."""
    batch = hidden_states.shape[0]
    channels = hidden_states.numel() // batch
    states = state.shape[-1]
    out = hidden_states.new_empty(hidden_states.shape)
    z = kwargs.get("z")
    _record("selective_scan", ATTENTION, batch, 1, 0.0, selective_scan_flops(1, channels, states), channels * states,
            [hidden_states, dt, B, C, z], [out], True)
    return out


def mamba2_chunk_scan(hidden_states, dt, A, B, C, chunk_size, D=None, dt_bias=None, initial_states=None,
                      dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False, *args, **kwargs):
    """Mamba-2 SSD over x [B, L, H, P] with B, C [B, L, G, N]; state [B, H, P, N]."""
    batch, length, heads, head_dim = hidden_states.shape
    groups, states = B.shape[-2], B.shape[-1]
    matrix, vector = ssd_flops(length, heads, head_dim, groups, states, chunk_size)
    out = hidden_states.new_empty(hidden_states.shape)
    _record("ssd", ATTENTION, batch, length, matrix, vector, heads * head_dim * states,
            [hidden_states, dt, B, C], [out], initial_states is not None)
    if return_final_states:
        return out, hidden_states.new_empty(batch, heads, head_dim, states)
    return out


def mamba2_selective_state_update(state, hidden_states, dt, A, B, C, D=None, *args, **kwargs):
    """One decode token: x [B, H, P] against state [B, H, P, N]."""
    batch, heads, head_dim = hidden_states.shape[0], hidden_states.shape[1], hidden_states.shape[-1]
    groups, states = B.shape[-2] if B.dim() == 3 else 1, B.shape[-1]
    matrix, vector = ssd_flops(1, heads, head_dim, groups, states, 1)
    out = hidden_states.new_empty(hidden_states.shape)
    _record("ssd", ATTENTION, batch, 1, matrix, vector, heads * head_dim * states, [hidden_states, dt, B, C], [out],
            True)
    return out


def _delta_rule(kind: str, query, key, value, g, beta, chunk_size, initial_state, output_final_state,
                channel_decay: bool):
    batch, length, heads, key_dim = query.shape
    value_dim = value.shape[-1]
    heads = max(heads, value.shape[2])
    matrix, vector = delta_rule_flops(length, heads, key_dim, value_dim, chunk_size, channel_decay)
    out = value.new_empty(batch, length, value.shape[2], value_dim)
    _record(kind, ATTENTION, batch, length, matrix, vector, heads * key_dim * value_dim,
            [query, key, value, g, beta], [out], initial_state is not None)
    final = value.new_empty(batch, heads, key_dim, value_dim) if output_final_state else None
    return out, final


def torch_chunk_gated_delta_rule(query, key, value, g, beta, chunk_size=64, initial_state=None,
                                 output_final_state=False, *args, **kwargs):
    return _delta_rule("gated_delta_rule", query, key, value, g, beta, chunk_size, initial_state,
                       output_final_state, False)


def torch_recurrent_gated_delta_rule(query, key, value, g, beta, initial_state=None, output_final_state=False,
                                     *args, **kwargs):
    return _delta_rule("gated_delta_rule", query, key, value, g, beta, 64, initial_state, output_final_state, False)


def chunk_kimi_delta_attention(query, key, value, g, beta, chunk_size=64, initial_state=None,
                               output_final_state=False, *args, **kwargs):
    return _delta_rule("kda", query, key, value, g, beta, chunk_size, initial_state, output_final_state, True)


def recurrent_kimi_delta_attention(query, key, value, g, beta, initial_state=None, output_final_state=False,
                                   *args, **kwargs):
    return _delta_rule("kda", query, key, value, g, beta, 64, initial_state, output_final_state, True)


def rwkv_linear_attention(time_decay, time_first, key, value, state=None, return_state=False):
    """RWKV-4 WKV over key/value [B, L, C]; state (num, den, max) per channel."""
    batch, length, channels = key.shape
    out = value.new_empty(value.shape)
    _record("wkv", ATTENTION, batch, length, 0.0, wkv_flops(length, channels), 3 * channels, [key, value], [out],
            state is not None)
    if return_state or state is not None:
        state = [key.new_empty(batch, channels, dtype=key.dtype) for _ in range(3)]
    return out, state


# Names in transformers' modeling files -> tracecost's replacement
KERNELS = {
    "causal_conv1d_fn": causal_conv1d_fn,
    "causal_conv1d_update": causal_conv1d_update,
    "mamba_selective_scan": mamba_selective_scan,
    "mamba_selective_state_update": mamba_selective_state_update,
    "mamba2_chunk_scan": mamba2_chunk_scan,
    "mamba2_selective_state_update": mamba2_selective_state_update,
    "torch_chunk_gated_delta_rule": torch_chunk_gated_delta_rule,
    "torch_recurrent_gated_delta_rule": torch_recurrent_gated_delta_rule,
    "chunk_kimi_delta_attention": chunk_kimi_delta_attention,
    "recurrent_kimi_delta_attention": recurrent_kimi_delta_attention,
    "rwkv_linear_attention": rwkv_linear_attention,
}


def lightning_forward(self, hidden_states: torch.Tensor, *args, **kwargs):
    """MiniMax lightning attention: projections as HF runs them, the decayed linear attention as one op."""
    import torch
    batch, length, _ = hidden_states.shape
    heads, head_dim = self.num_attention_heads, self.head_dim
    qkv = self.act_fn(self.qkv_proj(hidden_states)).reshape(batch, length, heads, 3 * head_dim)
    query, key, value = torch.split(qkv, head_dim, dim=3)
    matrix, vector = lightning_flops(length, heads, head_dim, self.block_size)
    out = value.new_empty(batch, length, heads * head_dim)
    _record("lightning", ATTENTION, batch, length, matrix, vector, heads * head_dim * head_dim, [query, key, value],
            [out], _continues(True))
    out = self.norm(out)
    out = torch.sigmoid(self.output_gate(hidden_states)) * out
    return self.out_proj(out), None


def rglru_scan(self, hidden_states, recurrent_gate, reset, recurrent_states, *args, **kwargs):
    """RecurrentGemma's RG-LRU scan (a Python loop over tokens in HF) as one op: h = a * h + x per channel."""
    batch, length, width = hidden_states.shape
    out = hidden_states.new_empty(hidden_states.shape)
    _record("rglru", ATTENTION, batch, length, 0.0, 3.0 * length * width, width, [hidden_states, recurrent_gate],
            [out], _continues(recurrent_states))
    return out, hidden_states.new_empty(batch, width)


def mlstm_backend(self, query, key, value, igate, fgate, c_initial=None, n_initial=None, m_initial=None,
                  *args, **kwargs):
    """xLSTM's mLSTM cell over [B, H, S, d] (native chunkwise loops in HF) as one op; returns h and (C, n, m)."""
    batch, heads, length, key_dim = query.shape
    value_dim = value.shape[-1]
    matrix, vector = mlstm_flops(length, heads, key_dim, value_dim, self.config.chunk_size)
    out = value.new_empty(batch, heads, length, value_dim)
    _record("mlstm", ATTENTION, batch, length, matrix, vector, heads * (key_dim * value_dim + key_dim + 1),
            [query, key, value, igate, fgate], [out], _continues(c_initial))
    state = (value.new_empty(batch, heads, key_dim, value_dim), value.new_empty(batch, heads, key_dim),
             value.new_empty(batch, heads, 1))
    return out, state


def _rwkv_shifted(module, hidden, state, index: int):
    """The previous token's hidden state: from the cached state in a decode step ([B, 1, H], where HF's [B, H]
    broadcasts a batch of B into B x B rows), else the sequence shifted by one."""
    if hidden.size(1) == 1 and state is not None:
        return state[index][:, :, module.layer_id].unsqueeze(1)
    shifted = module.time_shift(hidden)
    if state is not None:
        shifted[:, 0] = state[index][:, :, module.layer_id]
    return shifted


def rwkv_extract_key_value(self, hidden, state=None):
    import torch
    shifted = _rwkv_shifted(self, hidden, state, 1)
    key = hidden * self.time_mix_key + shifted * (1 - self.time_mix_key)
    value = hidden * self.time_mix_value + shifted * (1 - self.time_mix_value)
    receptance = hidden * self.time_mix_receptance + shifted * (1 - self.time_mix_receptance)
    key, value, receptance = self.key(key), self.value(value), torch.sigmoid(self.receptance(receptance))
    if state is not None:
        state[1][:, :, self.layer_id] = hidden[:, -1]
    return receptance, key, value, state


def rwkv_feed_forward(self, hidden, state=None):
    import torch
    shifted = _rwkv_shifted(self, hidden, state, 0)
    key = hidden * self.time_mix_key + shifted * (1 - self.time_mix_key)
    receptance = hidden * self.time_mix_receptance + shifted * (1 - self.time_mix_receptance)
    key = torch.square(torch.relu(self.key(key)))
    value = self.value(key)
    receptance = torch.sigmoid(self.receptance(receptance))
    if state is not None:
        state[0][:, :, self.layer_id] = hidden[:, -1]
    return receptance * value, state


# Module classes whose whole forward is replaced (their kernel is inline Python, not a named function)
FORWARDS = {
    "MiniMaxLightningAttention": lightning_forward,
    "RwkvFeedForward": rwkv_feed_forward,
    "xLSTMBackend": mlstm_backend,
}
# Module classes whose scan method is replaced: (method name, replacement)
METHODS = {
    "RecurrentGemmaRglru": ("_rnn_scan", rglru_scan),
    "RwkvSelfAttention": ("extract_key_value", rwkv_extract_key_value),
}


def state_note() -> str:
    return ("recurrent layers keep a constant-size state per sequence (no KV cache); a prefix-cache hit on them "
            "assumes the engine checkpointed the state at the cached prefix's end (as vLLM/SGLang do for hybrid "
            "models at block boundaries); without such checkpoints the whole prefix is recomputed")
