"""Engines prefill MLA (DeepSeek) in the expanded multi-head form and decode it absorbed (cost/engines.py MlaPrefill,
cost/engine_pricing.py expanded_mla_prefill)."""
import pytest

from cost.engine_kernels import prefill_attention_time
from cost.engine_pricing import expanded_mla_prefill
from cost.engines import ENGINES, MLA_DECODE_QUERY_ROWS
from cost.estimate import Parallelism, estimate
from cost.kernel_rows import attention_model, gemm_rows_time
from cost.profile import load_profile
from tracer.trace import trace
from tracer.work import Request


def _mla_work(query, context):
    t = trace("deepseek-v3", Request(1, query, context))
    w = next(op.attention for op in t.ops if op.attention is not None)
    return w, t


def test_the_trace_records_the_expanded_head_dims_beside_the_absorbed_work():
    w, _ = _mla_work(512, 0)
    assert (w.kv_heads, w.qk_head_dim, w.v_head_dim, w.kv_shares_storage) == (1, 576, 512, True)
    assert w.expanded_head_dims == (192, 128)          # 128 nope + 64 rope, 128 v (DeepSeek-V3's config)
    llama = next(op.attention for op in trace("llama-3.1-8b", Request(1, 64, 0)).ops if op.attention is not None)
    assert llama.expanded_head_dims is None


def test_which_chunks_each_engine_runs_expanded():
    vllm, sglang, trt = (ENGINES[e].mla_prefill for e in ("vllm", "sglang", "trtllm"))
    assert not vllm.expanded(MLA_DECODE_QUERY_ROWS, 0) and vllm.expanded(MLA_DECODE_QUERY_ROWS + 1, 5000)
    assert sglang.expanded(4096, 0) and not sglang.expanded(4096, 4096) and sglang.expanded(4096, 8192)
    assert trt.expanded(2048, 100)


def test_expanded_prefill_against_its_parts():
    """FlashAttention over 128 heads of 192 / 128 dims, plus the context's latent up-projected (512 -> 128 x 256)."""
    hw = load_profile("h200")
    cal = hw.engine("vllm")
    w, _ = _mla_work(2048, 4096)
    p = attention_model(cal.prefill_attention, "bf16", False, "x", cal)
    attn = prefill_attention_time(p, hw.compute_units, hw.matrix_peak("bf16"), hw.vector_peak("fp32"), hw.bandwidth,
                                  hw.l2_bytes, 1, 2048, 4096, 128, 128, 192, 128).scalar().seconds
    up = gemm_rows_time(cal, hw, "bf16", 4096, 128 * 256, 512, True, model_step=True).scalar().seconds
    assert float(expanded_mla_prefill(w, hw, cal).seconds) == pytest.approx(attn + up, rel=1e-9)


def test_long_prompts_price_far_less_attention_than_the_absorbed_form_and_say_so():
    hw = load_profile("h200")
    t = trace("deepseek-v3", Request(1, 8192, 16384))
    par = Parallelism(8)
    vllm = estimate(t, hw, engine="vllm", par=par)
    sglang_absorbed = estimate(trace("deepseek-v3", Request(1, 8192, 4096)), hw, engine="sglang", par=par)
    sglang_expanded = estimate(trace("deepseek-v3", Request(1, 8192, 8192)), hw, engine="sglang", par=par)
    assert any(n.startswith("vLLM kernels: MLA prefill in the expanded multi-head form") for n in vllm.notes)
    # absorbed: 1088 FLOPs a pair a head; expanded: 320 and the up-projection: a prefix of 4096 absorbed costs
    # more attention than one of 8192 expanded
    assert sglang_absorbed.breakdown_s["attention"] > sglang_expanded.breakdown_s["attention"]


def test_a_verification_sized_chunk_keeps_the_absorbed_kernel():
    hw = load_profile("h200")
    cal = hw.engine("vllm")
    e = estimate(trace("deepseek-v3", Request(1, 4, 4096)), hw, engine="vllm")
    priced = next(pk for pk in e.kernels if pk.kernel.op is not None and pk.kernel.op.attention is not None)
    p = attention_model(cal.prefill_attention, "bf16", False, "x", cal)
    absorbed = prefill_attention_time(p, hw.compute_units, hw.matrix_peak("bf16"), hw.vector_peak("fp32"),
                                      hw.bandwidth, hw.l2_bytes, 1, 4, 4096, 128, 1, 576, 512,
                                      kv_shares_storage=True).scalar().seconds
    assert priced.time.seconds == pytest.approx(absorbed, rel=1e-9)
