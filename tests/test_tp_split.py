"""Tensor parallelism splits every GEMM but MLA's low-rank down projections and the router, which every rank runs
whole (and holds whole)."""
import pytest

from cost.execution import ENGINE, build_kernels, replicated
from serving.capacity import replicated_weight_bytes, weight_bytes_per_gpu
from tracer import Request, trace

DECODE = Request(num_queries=4, query_length=1, context_length=64)


def _gemms(model: str, tp: int) -> dict[str, object]:
    kernels = build_kernels(trace(model, DECODE), ENGINE, tp=tp)
    return {k.module.rsplit(".", 1)[-1]: k for k in kernels if k.gemm is not None and k.op.layer in (0, 3, None)}


def test_mla_down_projections_and_the_router_run_whole_on_every_rank():
    one, eight = _gemms("deepseek-v3", 1), _gemms("deepseek-v3", 8)
    # q_a_proj and kv_a_proj_with_mqa read the same input: one merged GEMM, as wide at TP8 as on one GPU
    assert (eight["q_a_proj"].gemm.n, eight["q_a_proj"].gemm.k) == (1536 + 576, 7168) == \
        (one["q_a_proj"].gemm.n, one["q_a_proj"].gemm.k)
    assert eight["gate"].gemm.n == 256 == one["gate"].gemm.n
    # the GEMMs that follow them split as before
    assert eight["q_b_proj"].gemm.n == 128 * 192 // 8 and eight["q_b_proj"].flops == pytest.approx(
        one["q_b_proj"].flops / 8)


def test_the_replicated_rule():
    t = trace("deepseek-v3", DECODE)
    by_name = {op.module.rsplit(".", 1)[-1]: op for op in t.ops if op.gemm is not None}
    assert replicated(by_name["q_a_proj"]) and replicated(by_name["kv_a_proj_with_mqa"])
    assert replicated(by_name["gate"])     # the router, by its role
    assert not any(replicated(by_name[n]) for n in ("q_b_proj", "o_proj", "down_proj", "lm_head"))


def test_replicated_weights_are_held_whole_on_every_rank():
    t = trace("deepseek-v3", DECODE)
    whole = replicated_weight_bytes(t)
    # 61 layers of q_a_proj (7168 x 1536) and kv_a_proj_with_mqa (7168 x 576), fp8
    assert whole >= 61 * 7168 * (1536 + 576)
    # against an even split of everything, each of 8 ranks holds 7/8 of them more
    assert weight_bytes_per_gpu(t, tp=8) - weight_bytes_per_gpu(t, tp=1) / 8 == pytest.approx(whole * 7 / 8)
    assert replicated_weight_bytes(trace("llama-3.1-70b", DECODE)) == 0
