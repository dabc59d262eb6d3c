"""vLLM's FlashAttention backend runs a step's whole batch in one varlen call: in a step that also carries a prompt
chunk, its decode rows run the prefill kernel, a query tile each (cost/engine_kernels/calibration.py
mixed_step_decodes), where engines that split the batch run them on their decode kernel."""
import json
import math

import pytest

from cost.estimate import Parallelism, estimate
from cost.profile import ProfileError, load_profile, parse_profile, profiles_dir
from serving.step_cost import StepCost
from tracer.model_source import resolve_model
from tracer.trace import trace
from tracer.work import Request, TraceOptions

BATCH, CONTEXT = 64, 2048


def _decode_attention_s(model: str, device: str, engine: str, mixed: bool) -> float:
    t = trace(model, Request(BATCH, 1, CONTEXT, decode=True))
    return estimate(t, load_profile(device), engine=engine, mixed_step=mixed).breakdown_s["attention"]


def _padded_tile_flops(query_rows: int, ctas_per_layer: int, layers: int, head_dim: int = 128) -> float:
    """The matrix FLOPs of query tiles of `query_rows` rows over the decode's keys, key tiles of 128."""
    key_tiles = math.ceil((CONTEXT + 1) / 128)
    return ctas_per_layer * layers * key_tiles * 2.0 * query_rows * 128 * 2 * head_dim


def test_flashattention2_runs_a_64_row_tile_per_query_head_for_each_decode_row():
    """Qwen3-8B (32 query heads over 8 KV heads, 36 layers) on A100: beside a chunk each decode row takes a 64-row
    tile per query head, whose FLOPs at the datasheet's peak bound the time from below; the one-query path the
    same rows take alone reads the cache in less than that."""
    a100 = load_profile("a100")
    floor = _padded_tile_flops(64, BATCH * 32, 36) / a100.matrix_peak("bf16")
    alone = _decode_attention_s("qwen3-8b", "a100", "vllm", mixed=False)
    beside = _decode_attention_s("qwen3-8b", "a100", "vllm", mixed=True)
    assert beside >= floor > alone
    assert beside > 2 * alone


def test_flashattention3_packs_a_kv_heads_query_heads_into_one_tile():
    """On H100 (FlashAttention-3, pack_gqa with vLLM's paged cache) a KV head's 4 query heads share a 128-row tile:
    8 tiles a row and layer, not 32."""
    h100 = load_profile("h100")
    packed = _padded_tile_flops(128, BATCH * 8, 36) / h100.matrix_peak("bf16")
    beside = _decode_attention_s("qwen3-8b", "h100", "vllm", mixed=True)
    assert beside >= packed
    assert beside > _decode_attention_s("qwen3-8b", "h100", "vllm", mixed=False)
    assert load_profile("h100").engine("vllm").mixed_step_decodes["packs_gqa"] is True
    assert load_profile("a100").engine("vllm").mixed_step_decodes["packs_gqa"] is False


@pytest.mark.parametrize("model, device, engine", [
    ("qwen3-8b", "a100", "sglang"),       # SGLang runs a new prefill batch apart from the decodes
    ("qwen3-8b", "a100", "trtllm"),       # TensorRT-LLM's generation kernel takes the decode rows
    ("qwen3-8b", "b200", "vllm"),         # FlashInfer on Blackwell plans decode and prefill apart
    ("deepseek-v2-lite", "h200", "vllm"),  # MLA backends split the batch
    ("gpt-oss-20b", "a100", "vllm"),      # sinks run on the Triton unified kernel here
    ("qwen3-8b", "mi300x", "vllm"),       # the H100 kernel models, not its backend
])
def test_engines_that_split_the_batch_price_decode_rows_alone(model, device, engine):
    assert _decode_attention_s(model, device, engine, mixed=True) == \
        _decode_attention_s(model, device, engine, mixed=False)


def test_the_backend_is_carried_within_a_vendor_only():
    assert load_profile("h100pcie").engine("vllm").mixed_step_decodes["packs_gqa"] is True
    assert load_profile("l4").engine("vllm").mixed_step_decodes["packs_gqa"] is False
    assert load_profile("mi300x").engine("vllm").mixed_step_decodes == {}
    assert load_profile("a100").engine("sglang").mixed_step_decodes == {}


@pytest.mark.parametrize("value", [{"packs_gqa": "yes", "why": "x"}, {"packs_gqa": True}, {"why": "x"},
                                   {"packs_gqa": True, "why": ""}, {"packs_gqa": True, "why": "x", "tile": 64}])
def test_a_malformed_section_names_the_field(value):
    data = json.loads((profiles_dir() / "a100.json").read_text())
    data["engines"]["vllm"]["mixed_step_decodes"] = value
    with pytest.raises(ProfileError, match=r"engines\.vllm\.mixed_step_decodes: must be"):
        parse_profile(data, "custom_a100", "custom.json").engine("vllm")


def test_a_kernel_table_refit_keeps_the_section():
    from cost.calibrate_engine import calibrate
    a100 = load_profile("a100")
    base = a100.engine("vllm")
    refit = calibrate({}, a100, "vllm", "test refit", base=base, only=set())
    assert refit.to_json()["mixed_step_decodes"] == base.mixed_step_decodes
    assert refit.to_json()["sink_attention"] == base.sink_attention


def test_steady_state_steps_carry_a_chunk_in_proportion():
    """A steady-state step with half a chunk a step is one step in two with a chunk: its decode rows cost half the
    way from alone to beside a chunk; with no prefill they cost what they cost alone."""
    cost = StepCost(resolve_model("qwen3-8b"), load_profile("a100"), TraceOptions(), "engine", Parallelism(1))
    plain = StepCost(resolve_model("qwen3-8b"), load_profile("a100"), TraceOptions(), "engine", Parallelism(1))
    plain.__dict__["mixes_decode_rows"] = False
    assert cost.mixes_decode_rows
    assert cost.steady(BATCH, 0.0, 1024, 0.0, CONTEXT) == plain.steady(BATCH, 0.0, 1024, 0.0, CONTEXT)
    extra = cost.mixed_decode_attention(BATCH, CONTEXT) - plain.mixed_decode_attention(BATCH, CONTEXT)
    assert extra > 0
    half = cost.steady(BATCH, 512.0, 1024, 0.0, CONTEXT) - plain.steady(BATCH, 512.0, 1024, 0.0, CONTEXT)
    assert half == pytest.approx(0.5 * extra, rel=1e-9)
    full = cost.steady(BATCH, 2048.0, 1024, 0.0, CONTEXT) - plain.steady(BATCH, 2048.0, 1024, 0.0, CONTEXT)
    assert full == pytest.approx(extra, rel=1e-9)
    # an event-simulated step with a chunk prices its decode rows beside it
    assert cost.step([(512, 0)], BATCH, CONTEXT) - plain.step([(512, 0)], BATCH, CONTEXT) == \
        pytest.approx(extra, rel=1e-9)
    assert any("priced in its prefill kernel" in n for n in cost.formats_notes())
