"""Derived step traces (serving/derived_trace.py) against real traces, to the last FLOP and byte."""
from __future__ import annotations

from dataclasses import replace

import pytest

from cost.estimate import Parallelism, estimate
from cost.profile import load_profile
from serving.derived_trace import attention_work, derive, outside_attention
from serving.step_cost import StepCost
from tracer import Request, TraceOptions, resolve_model, trace
from tracer.work import OTHER, Op, Trace


def _tiny_hybrid(tmp_path) -> str:
    """Qwen3-Next in miniature: gated-delta-rule layers beside attention layers, routed experts."""
    from transformers import AutoConfig
    folder = tmp_path / "qwen3_next"
    folder.mkdir()
    AutoConfig.for_model("qwen3_next", hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
                         linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, num_experts=4,
                         num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                         vocab_size=100).to_json_file(str(folder / "config.json"))
    return str(folder)


# dense GQA; MLA with routed experts; attention sinks with a sliding window on every other layer
MODELS = ["llama-3.2-1b", "deepseek-v2-lite", "gpt-oss-20b"]


def _decode(spec, batch: int, context: int):
    return trace(spec, Request(batch, 1, context, decode=True), TraceOptions())


@pytest.mark.parametrize("model", MODELS + ["hybrid"])
@pytest.mark.parametrize("batch,context", [(8, 1000), (64, 4096), (3, 130)])
def test_decode_attention_derived_exactly(tmp_path, model, batch, context):
    spec = resolve_model(_tiny_hybrid(tmp_path) if model == "hybrid" else model)
    one, two, real = (_decode(spec, b, context) for b in (1, 2, batch))
    derived = derive(one, two, real.request, 1, 2, batch, attention_work)
    assert derived is not None
    expected = [op for op in real.ops if attention_work(op)]
    assert expected and derived.ops == expected          # every field, FLOPs and bytes to the last digit
    assert derived.flops == sum(op.flops * op.count for op in expected)


@pytest.mark.parametrize("model", MODELS)
def test_prefill_chunks_attention_derived_exactly(model):
    """Several prompt chunks in one step (a batched varlen prefill) attend each over its own context."""
    spec = resolve_model(model)
    one, two, real = (trace(spec, Request(b, 64, 512), TraceOptions()) for b in (1, 2, 8))
    assert derive(one, two, real.request, 1, 2, 8, attention_work).ops == [op for op in real.ops if attention_work(op)]


@pytest.mark.parametrize("model,par", [("llama-3.2-1b", Parallelism(2)), ("deepseek-v2-lite", Parallelism(1)),
                                       ("deepseek-v2-lite", Parallelism(1, ep=2, attention_dp=2)),
                                       ("gpt-oss-20b", Parallelism(2))])
@pytest.mark.parametrize("execution", ["engine", "eager"])
def test_step_cost_prices_derived_decode_attention_as_the_real_trace(model, par, execution):
    """The search's decode attention beyond two sequences is priced from the derived trace: the same seconds as
    pricing the real trace of that batch, in an engine's kernels and in HF eager ones."""
    if execution == "eager" and par.attention_dp > 1:
        pytest.skip("attention data parallelism is priced for engine execution only")
    spec, hw = resolve_model(model), load_profile("h100")
    cost = StepCost(spec, hw, TraceOptions(), execution, par)
    for batch in (4, 32):
        real = estimate(_decode(spec, batch, 2048), hw, execution, par, "vllm").breakdown_s["attention"]
        assert cost._attention_s(Request(batch, 1, 2048, decode=True)) == real


def test_experts_are_not_affine_in_the_tokens():
    """Routed experts activate an expected number of experts that is not affine in the tokens: an affine rule
    would price them wrongly, which is why a step's token buckets are traced for such ops."""
    spec = resolve_model("deepseek-v2-lite")
    one, two, eight = (trace(spec, Request(1, n, 0), TraceOptions()) for n in (1, 2, 8))
    derived = derive(one, two, eight.request, 1, 2, 8, lambda op: op.experts is not None)
    assert derived is not None and derived.ops != [op for op in eight.ops if op.experts is not None]


def _op(rows: int, module: str = "m") -> Op:
    return Op(name="aten.add", op_class=OTHER, unit="vector", flops=4.0 * rows, bytes_read=16.0 * rows + 2.0,
              bytes_written=8.0 * rows, dtype="bf16", module=module, module_type="M", shapes=((rows, 4),))


def test_derive_refuses_what_it_cannot_carry():
    a, b = Trace("m", Request(1, 1), TraceOptions(), [_op(1)], 0, 0, 1, 0.0, 0.0), \
        Trace("m", Request(1, 3), TraceOptions(), [_op(3)], 0, 0, 1, 0.0, 0.0)
    at_two = derive(a, b, Request(1, 2), 1, 3, 2)
    assert at_two.ops == [_op(2)] and at_two.request == Request(1, 2)
    half = replace(b, ops=[_op(2)])                            # 2 rows at count 3: half a row per count
    assert derive(a, half, Request(1, 5), 1, 3, 5).ops == [_op(3)]
    assert derive(a, half, Request(1, 2), 1, 3, 2) is None     # 1.5 rows: an integer the rule cannot carry
    other = replace(b, ops=[_op(3, module="n")])
    assert derive(a, other, Request(1, 5), 1, 3, 5) is None   # a name that differs
    assert derive(a, replace(b, ops=[_op(3)] * 2), Request(1, 5), 1, 3, 5) is None   # another op list


DENSE = ["llama-3.2-1b", "qwen3-8b", "gemma-2-9b", "mistral-7b"]


@pytest.mark.parametrize("model", DENSE)
def test_prefill_outside_attention_derived_exactly(model):
    """A dense model's ops beyond attention are affine in a step's tokens from two tokens on: derived from the
    traces of 2 and 4 they are the traced ops at 8, 1000 and 16384 tokens, to the last FLOP and byte."""
    spec = resolve_model(model)
    two, four = (trace(spec, Request(1, n, 0), TraceOptions()) for n in (2, 4))
    for n in (8, 1000, 16384):
        real = trace(spec, Request(1, n, 0), TraceOptions())
        derived = derive(two, four, real.request, 2, 4, n, outside_attention)
        assert derived.ops == [op for op in real.ops if outside_attention(op)]


@pytest.mark.parametrize("model,par", [("llama-3.2-1b", Parallelism(1)), ("qwen3-8b", Parallelism(2)),
                                       ("gemma-2-9b", Parallelism(2, pp=2))])
def test_step_cost_prefill_buckets_priced_as_the_real_traces(model, par):
    """linear() beyond four tokens comes from derived traces: the same seconds and kernel launches as the real
    trace of each bucket (which a fresh StepCost with derivation off prices)."""
    spec, hw = resolve_model(model), load_profile("h100")
    derived, real = (StepCost(spec, hw, TraceOptions(), "engine", par) for _ in range(2))
    real._affine_prefill = ()          # off: every bucket traced
    for n in (8, 64, 2048):
        assert derived.linear(n) == real.linear(n)
        assert derived._launches[n] == real._launches[n]
    assert derived._affine_prefill     # the derivation was used


@pytest.mark.parametrize("model", ["qwen3-30b-a3b", "mixtral-8x7b"])
def test_routed_experts_prefill_buckets_derived_beyond_128_tokens(model):
    """Routed models derive from the traces of 64 and 128 tokens (their routing ops settle once a step's expert
    picks outnumber the experts): the experts op by its expected active count; the same ops and seconds as the
    traced buckets."""
    spec, hw = resolve_model(model), load_profile("h100")
    at = {n: trace(spec, Request(1, n, 0), TraceOptions()) for n in (64, 128, 512, 4096)}
    for n in (512, 4096):
        derived = derive(at[64], at[128], at[n].request, 64, 128, n, outside_attention)
        assert derived.ops == [op for op in at[n].ops if outside_attention(op)]
    derived, real = (StepCost(spec, hw, TraceOptions(), "engine", Parallelism(2, ep=2)) for _ in range(2))
    real._affine_prefill = ()
    for n in (256, 2048):
        assert derived.linear(n) == real.linear(n) and derived._launches[n] == real._launches[n]
    assert derived._affine_prefill[:3] == (64, 128, 1024)


def test_a_derivation_that_misses_the_checked_step_is_not_used():
    """gpt-oss's mxfp4 expert weights come out a rounding away from the traced ones: its buckets stay traced."""
    cost = StepCost(resolve_model("gpt-oss-20b"), load_profile("h100"), TraceOptions(), "engine", Parallelism(1))
    cost.linear(2048)
    assert cost._affine_prefill == ()
