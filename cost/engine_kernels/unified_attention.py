"""vLLM's Triton unified attention, the kernel vLLM runs an attention with sink logits through (gpt-oss) on NVIDIA
parts without FlashAttention-3 (Ampere, Ada, SM120): FlashAttention-2 has no sinks (vllm/platforms/cuda.py
get_attn_backend_cls: `has_sink and not is_device_capability(90)` -> TRITON_ATTN; vllm/v1/attention/backends/
fa_utils.py flash_attn_supports_sinks: FlashAttention 3 only).

Its prefill kernel (vllm/attention/ops/triton_unified_attention.py, kernel_unified_attention_2d) runs one program
per (BLOCK_Q query tokens, KV head): BLOCK_M = 16 query rows, the BLOCK_Q = 16 / group tokens of all the query heads
of one KV head (a group above 16 rounds up to a power of two, one token a program), over key tiles of 32 with the
tiles past the causal edge skipped. Each program loads every key and value its rows see, so the cache is read once
per BLOCK_Q query tokens, not once per query tile of 128 as in FlashAttention: 2 x BLOCK_M / (KV bytes) FLOPs per
byte read (16 for a bf16 cache), below what any GPU's bandwidth feeds its matrix units. The re-reads stream like
any kernel's reads (the engine's fitted streaming model), the share the call's keys and values leave in L2 from it:

    time = max(the fitted prefill kernel's time, re-read bytes / streaming rate)
"""
from __future__ import annotations

import numpy as np

from .common import Times, arrays
from .stream import StreamParams

BLOCK_M = 16            # query rows a program holds while its group fits
TILE_KEYS = 32          # TILE_SIZE_PREFILL


def unified_rows(group: int) -> tuple[int, int]:
    """(query rows, query tokens) one program holds for a group of `group` query heads per KV head."""
    rows = BLOCK_M if group <= BLOCK_M else 1 << (int(group) - 1).bit_length()
    return rows, max(1, rows // int(group))


def unified_prefill_time(flash: Times, stream: StreamParams, bandwidth: float, l2_bytes: float, batch, query,
                         context, heads: int, kv_heads: int, head_dim, v_head_dim, window=0,
                         kv_bytes: float = 2.0, l2_share: float = 1.0) -> Times:
    """`flash`: the device's fitted prefill kernel on the same call (the unified kernel does no less work).
    `l2_share`: the share of L2 that can hold data every unit reads (device data: a part whose L2 is split in
    partitions, each caching what its own units read, holds such data once per partition)."""
    b, q, c, w = arrays(batch, query, context, window)
    _, tokens = unified_rows(heads // kv_heads)
    # keys the programs of one sequence see, on average: the causal edge moves BLOCK_Q tokens a program,
    # rounded up to whole key tiles; a sliding window caps them at the window (plus the tile it ends in)
    seen = c + (q + tokens) / 2.0 + TILE_KEYS / 2.0
    seen = np.where(w > 0, np.minimum(seen, w + TILE_KEYS), seen)
    per_key = kv_heads * (head_dim + v_head_dim) * kv_bytes
    rereads = b * np.ceil(q / tokens) * seen * per_key
    footprint = b * np.where(w > 0, np.minimum(c + q, w), c + q) * per_key
    # the share of the re-reads L2 serves: all of them while the call's keys and values fit in the share of L2
    # that holds what every unit reads
    hit = np.clip(l2_bytes * l2_share / np.maximum(footprint, 1.0), 0.0, 1.0)
    memory = rereads * (hit / stream.l2_speedup + 1.0 - hit) / (bandwidth * stream.memory)
    fixed = stream.fixed_us * 1e-6
    t = Times(fixed + memory, np.zeros_like(memory), memory, np.full_like(memory, fixed))
    slower = t.seconds > flash.seconds
    return Times(np.where(slower, t.seconds, flash.seconds), flash.compute_s,
                 np.where(slower, t.memory_s, flash.memory_s), np.where(slower, t.fixed_s, flash.fixed_s))
