"""Every GEMM in the format the engine runs it in: the checkpoint's quantization_config (tracer/weight_formats.py),
the engine's rules (cost/engine_formats.json) and weight-only formats on devices without the matrix type
(cost/op_formats.py)."""
import json
import re
from dataclasses import replace

import pytest

from cost.estimate import Parallelism, estimate
from cost.kernel import main as kernel_main
from cost.op_formats import op_format, run_format
from cost.profile import ProfileError, load_profile
from tracer.model_source import resolve_model
from tracer.trace import trace
from tracer.weight_formats import checkpoint_formats, matches
from tracer.work import Request, TraceOptions

DECODE = Request(1, 1, 16, decode=True)


def run_formats(model: str, device: str, engine: str) -> dict[str, str]:
    """weight owner (layer index as *) -> the format its GEMM runs in; weight-only formats say so."""
    t = trace(model, DECODE)
    hw = load_profile(device)
    moe_models = tuple(hw.engine(engine).moe)
    table: dict[str, set[str]] = {}
    for op in t.ops:
        if op.op_class != "gemm" or op.weight_format is None:
            continue
        f = op_format(op, engine, hw, t.options.dtype, moe_models)
        owner = re.sub(r"layers\.\d+\.", "layers.*.", op.weight_module)
        table.setdefault(owner, set()).add(f.kernel if f.how != "weight-only" else f"{f.checkpoint} weight-only")
    assert all(len(v) == 1 for v in table.values()), table
    return {k: v.pop() for k, v in table.items()}


def test_deepseek_v3_on_h200():
    # the official FP8 checkpoint: quant_method fp8, weight_block_size [128, 128], nothing ignored
    ds = "model.layers.*."
    attention = {ds + "self_attn." + m: "fp8_block" for m in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "o_proj")}
    mlp = {ds + "mlp." + m: "fp8_block" for m in ("gate_proj", "up_proj", "down_proj", "experts", "shared_experts.gate_proj",
                                                   "shared_experts.up_proj", "shared_experts.down_proj")}
    vllm = {**attention, **mlp,
            # vllm/model_executor/models/deepseek_v2.py DeepseekV2MoE: gate = ReplicatedLinear(..., quant_config=None)
            ds + "mlp.gate": "bf16",
            # vLLM MLA (v1/attention/backends/mla/common.py): kv_b_proj dequantized into W_UK_T / W_UV, torch.bmm bf16
            ds + "self_attn.kv_b_proj": "bf16",
            # ParallelLMHead is not a LinearBase: unquantized (and stored bf16 in the checkpoint)
            "lm_head": "bf16"}
    assert run_formats("deepseek-v3", "h200", "vllm") == vllm
    # sglang/srt/models/deepseek_v2.py: MoEGate bf16; post_load_weights block_quant_dequant(kv_b_proj) -> bf16 bmm
    assert run_formats("deepseek-v3", "h200", "sglang") == vllm
    # tensorrt_llm/_torch/models/modeling_deepseekv3.py DeepseekV3Gate unquantized; its MLA keeps the FP8 block bmm
    assert run_formats("deepseek-v3", "h200", "trtllm") == {**vllm, ds + "self_attn.kv_b_proj": "fp8_block"}


def test_deepseek_v3_checkpoint_formats_are_the_configs():
    t = trace("deepseek-v3", DECODE)
    stored = {(op.weight_role, op.weight_format) for op in t.ops if op.weight_format is not None}
    # the config names no module: every linear layer, the router and kv_b_proj are fp8_block as far as it says;
    # lm_head stays bf16 (transformers' get_keys_to_not_convert keeps the output embedding)
    assert stored == {("linear", "fp8_block"), ("experts", "fp8_block"), ("router", "fp8_block"),
                      ("mla_absorbed", "fp8_block"), ("lm_head", "bf16")}
    assert any("checkpoint weight formats" in n for n in t.notes)


def test_gpt_oss_120b():
    # config: quant_method mxfp4, modules_to_not_convert self_attn, mlp.router, embed_tokens, lm_head
    attention = {f"model.layers.*.self_attn.{m}": "bf16" for m in ("q_proj", "k_proj", "v_proj", "o_proj")}
    expected = {**attention, "model.layers.*.mlp.router": "bf16", "lm_head": "bf16"}
    # vllm/model_executor/layers/quantization/mxfp4.py: on Hopper (no fp4 matrix units) the triton_kernels
    # matmul_ogs MoE (mxfp4 weights, bf16 activations); on Ampere Marlin: weight-only either way
    for device in ("h100", "h200", "a100"):
        assert run_formats("gpt-oss-120b", device, "vllm") == {**expected,
                                                               "model.layers.*.mlp.experts": "mxfp4 weight-only"}
    assert run_formats("gpt-oss-120b", "h100", "sglang")["model.layers.*.mlp.experts"] == "mxfp4 weight-only"
    # gpt-oss-20b's published config carries the same quantization_config
    assert run_formats("gpt-oss-20b", "h100", "vllm") == {**expected, "model.layers.*.mlp.experts": "mxfp4 weight-only"}
    # Blackwell has fp4 matrix units: FlashInfer's MXFP4 MoE, priced with the nvfp4 kernel models
    assert run_formats("gpt-oss-120b", "b200", "vllm")["model.layers.*.mlp.experts"] == "nvfp4"


def test_qwen3_fp8_checkpoint():
    # Qwen/Qwen3-30B-A3B-Thinking-2507-FP8: fp8 e4m3, weight_block_size [128, 128]; modules_to_not_convert names
    # lm_head and every layer's mlp.gate (and norms)
    attention = {f"model.layers.*.self_attn.{m}": "fp8_block" for m in ("q_proj", "k_proj", "v_proj", "o_proj")}
    expected = {**attention, "model.layers.*.mlp.experts": "fp8_block", "model.layers.*.mlp.gate": "bf16",
                "lm_head": "bf16"}
    assert run_formats("qwen3-30b-a3b-2507-fp8", "h100", "vllm") == expected
    assert run_formats("qwen3-30b-a3b-2507-fp8", "h100", "sglang") == expected
    # vllm/model_executor/layers/quantization/fp8.py: below capability 89 FP8 weights run through Marlin (w8a16)
    weight_only = {k: ("fp8_block weight-only" if v == "fp8_block" else v) for k, v in expected.items()}
    assert run_formats("qwen3-30b-a3b-2507-fp8", "a100", "vllm") == weight_only
    t = trace("qwen3-30b-a3b-2507-fp8", DECODE)
    # the checkpoint's tensors (its weight listing): 29.03 GiB; embeddings, gates, norms and lm_head bf16
    assert t.weight_bytes / 2**30 == pytest.approx(29.03, abs=0.01)


def test_deepseek_v3_decode_gate_and_absorbed_bmm_in_bf16():
    t = trace("deepseek-v3", Request(1, 1, 1000, decode=True))
    e = estimate(t, load_profile("h200"), par=Parallelism(tp=8, ep=8), engine="vllm")
    by_module = {}
    for pk in e.kernels:
        key = (pk.kernel.name, pk.kernel.module.split(".")[-1])
        by_module[key] = by_module.get(key, 0.0) + pk.total_seconds
    # in fp8_block each gate and absorbed bmm paid the block-quant GEMM's ~78 us; in bf16 a few us each
    assert by_module[("aten.mm", "gate")] < 58 * 10e-6
    assert by_module[("aten.bmm", "self_attn")] < 122 * 10e-6
    assert e.latency_s < 0.035
    note = next(n for n in e.notes if n.startswith("formats (vLLM"))
    assert "router gates bf16 x58 (vLLM rule)" in note and "MLA absorbed bmm bf16 x122 (vLLM rule)" in note


def test_weight_only_is_priced_not_refused_and_says_so():
    t = trace("qwen3-30b-a3b-2507-fp8", Request(8, 1, 1000, decode=True))
    bf16 = trace("qwen3-30b-a3b-2507-fp8", Request(8, 1, 1000, decode=True), TraceOptions(dtype="bf16"))
    a100 = load_profile("a100")
    fp8, plain = estimate(t, a100, engine="vllm"), estimate(bf16, a100, engine="vllm")
    assert any(n.startswith("formats: fp8_block weights run weight-only on NVIDIA A100") and "bf16 math" in n
               for n in fp8.notes)
    # decode streams weights: one byte a weight instead of two is faster, but not by more than half
    assert 0.5 * plain.latency_s < fp8.latency_s < plain.latency_s
    # TensorRT-LLM has no FP8 path on Ampere: one line, naming the engines that have one
    with pytest.raises(ProfileError, match=r"TensorRT-LLM has no weight-only path for fp8_block .* \(vLLM, SGLang dequantize"):
        estimate(t, a100, engine="trtllm")


def test_engine_rule_and_device_capability_in_run_format():
    h200, a100 = load_profile("h200"), load_profile("a100")
    assert run_format("fp8_block", "router", "vllm", h200, moe=False).kernel == "bf16"
    assert run_format("fp8_block", "linear", "vllm", h200, moe=False).kernel == "fp8_block"
    f = run_format("fp8", "linear", "vllm", a100, moe=False)
    assert (f.kernel, f.weight_bytes, f.how) == ("bf16", 1.0, "weight-only")
    # AWQ/GPTQ int4 is weight-only on every device (W4A16): 4-bit weights, bf16 math
    f = run_format("int4", "linear", "vllm", h200, moe=False)
    assert (f.kernel, f.weight_bytes, f.how) == ("bf16", 0.5, "weight-only")


def test_fp4_units_without_a_fitted_fp4_kernel_run_weight_only_and_say_so():
    """MI355X has FP4 matrix units, but its kernel models are carried over (MI300X <- H100) without an FP4 fit:
    its MXFP4 weights were refused ("no GEMM format 'nvfp4' kernel model") where devices without FP4 units price
    them weight-only. B200, with its own nvfp4 fit, runs them natively."""
    mi355x, b200 = load_profile("mi355x"), load_profile("b200")
    cal = mi355x.engine("vllm")
    f = run_format("mxfp4", "linear", "vllm", mi355x, moe=False, gemm_models=tuple(cal.gemm))
    assert (f.kernel, f.how, f.unfitted_native) == ("bf16", "weight-only", True)
    native = run_format("mxfp4", "linear", "vllm", b200, moe=False, gemm_models=tuple(b200.engine("vllm").gemm))
    assert (native.kernel, native.how) == ("nvfp4", "native")
    t = trace("llama-3.1-8b", Request(1, 2048, 0), TraceOptions(dtype="mxfp4"))
    e = estimate(t, mi355x, engine="vllm")
    assert e.latency_s > 0
    assert any("has fp4 matrix units but no fit of vLLM's native mxfp4 kernel" in n for n in e.notes)


def test_marlin_math_ceiling_at_large_batch():
    """vLLM and SGLang run weight-only GEMMs through Marlin, whose math stops at 0.45 of the bf16 peak from 64
    rows (vLLM PR #2497's A100 sweep: 141 TFLOP/s); a small batch still streams the narrower weights faster."""
    from cost.engine_pricing import gemm_seconds
    from cost.execution import Kernel
    from tracer.work import GemmShape
    a100 = load_profile("a100")
    cal = a100.engine("vllm")
    n, k = 10240, 5120
    f = run_format("fp8", "linear", "vllm", a100, moe=False)
    assert f.math_peak_fraction == pytest.approx(0.45)
    # Marlin MoE (FP8 experts on A100) under the same ceiling; 4-bit experts take the int4 fit, Marlin MoE's own
    assert run_format("fp8", "experts", "vllm", a100, moe=True).math_peak_fraction == pytest.approx(0.45)
    assert run_format("int4", "experts", "vllm", a100, moe=True, moe_models=("bf16", "int4")).math_peak_fraction == 1.0
    plain = run_format("bf16", "linear", "vllm", a100, moe=False)

    def ms(m, fmt):
        kern = Kernel("gemm", "gemm", "x", 2.0 * m * n * k, 0.0, "bf16", 1, gemm=GemmShape(m, n, k))
        return gemm_seconds(kern, a100, cal, fmt).seconds * 1e3

    big = 4096
    assert ms(big, f) >= 2.0 * big * n * k / (0.45 * 312e12) * 1e3      # at or under 141 TFLOP/s
    assert 1.5 < ms(big, f) / ms(big, plain) < 2.5                     # cuBLAS bf16 runs at ~0.8 of the peak
    # one byte a weight at 0.78 of the bf16 kernel's streaming rate (PR #2497's batch-1 sweep: 3.12x fp16 on a
    # quarter of the bytes)
    assert f.stream_fraction == pytest.approx(0.78)
    assert 0.55 < ms(1, f) / ms(1, plain) < 0.75
    note = next(n for n in estimate(trace("qwen3-30b-a3b-2507-fp8", DECODE), a100, engine="vllm").notes
                if n.startswith("formats: fp8_block weights run weight-only"))
    assert ("math capped at 0.45 of the bf16 peak from 64 rows, its weights read at 0.78 of the bf16 kernel's rate "
            "(Marlin, measured on this GPU" in note)
    # W8A16 experts on H100 (Marlin MoE, priced with the bf16 fused-MoE fit): a long prefill's experts are held to it
    from cost.engine_pricing import moe_seconds
    from cost.execution import MoeCall
    h100 = load_profile("h100")
    moe = MoeCall(8192, 4096, 14336, 8, 2, True, 1, 1, "all-tokens")       # Mixtral's experts, 2,048 rows each
    kern = Kernel("fused_moe", "gemm", "experts", 0.0, 0.0, "bf16", 1, moe=moe)
    w8 = run_format("int8_wo", "experts", "vllm", h100, moe=True, moe_models=tuple(h100.engine("vllm").moe))
    flops = 2.0 * 8192 * 2 * 4096 * 14336 * 3
    capped = moe_seconds(kern, h100, h100.engine("vllm"), w8).seconds
    assert capped >= flops / (0.45 * 989e12)
    assert capped > 1.1 * moe_seconds(kern, h100, h100.engine("vllm"), replace(w8, math_peak_fraction=1.0)).seconds
    # TensorRT-LLM's own weight-only kernel (fpA_intB) has no ceiling in its A100 tables but a fitted cost per call:
    # an AWQ int4 GEMV of a 4096 x 4096 weight is the bf16 kernel on a quarter of the bytes plus 9 us
    trt = run_format("int4", "linear", "trtllm", a100, moe=False)
    assert (trt.math_peak_fraction, trt.stream_fraction, trt.call_us) == (1.0, 1.0, 9.0)
    gemv = Kernel("gemm", "gemm", "x", 2.0 * 4096 * 4096, 0.0, "bf16", 1, gemm=GemmShape(1, 4096, 4096))
    without = gemm_seconds(gemv, a100, a100.engine("trtllm"), replace(trt, call_us=0.0)).seconds
    assert gemm_seconds(gemv, a100, a100.engine("trtllm"), trt).seconds == pytest.approx(without + 9e-6)


def test_cost_kernel_rows_take_a_role_and_weight_only_formats(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps(r) for r in (
        {"op": "gemm", "m": 1, "n": 256, "k": 7168, "dtype": "fp8_block"},
        {"op": "gemm", "m": 1, "n": 256, "k": 7168, "dtype": "fp8_block", "role": "router"},
        {"op": "gemm", "m": 1, "n": 256, "k": 7168, "dtype": "bf16"})) + "\n")
    assert kernel_main(["--device", "h200", "--jsonl", str(rows)]) == 0
    block, router, bf16 = [json.loads(line)["ms"] for line in capsys.readouterr().out.splitlines()]
    assert router == bf16 < block / 5
    rows.write_text(json.dumps({"op": "gemm", "m": 16, "n": 5120, "k": 5120, "dtype": "fp8"}) + "\n"
                    + json.dumps({"op": "gemm", "m": 16, "n": 5120, "k": 5120, "dtype": "bf16"}) + "\n")
    assert kernel_main(["--device", "a100", "--jsonl", str(rows)]) == 0   # refused before: no fp8 GEMM on A100
    fp8, bf16 = [json.loads(line)["ms"] for line in capsys.readouterr().out.splitlines()]
    assert fp8 < bf16
    # the rows take Marlin's terms as a model step does: a large batch no faster than 0.45 of the bf16 peak
    rows.write_text(json.dumps({"op": "gemm", "m": 8192, "n": 5120, "k": 5120, "dtype": "fp8"}) + "\n")
    assert kernel_main(["--device", "a100", "--jsonl", str(rows)]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["ms"] >= 2 * 8192 * 5120 * 5120 / (0.45 * 312e12) * 1e3
    rows.write_text(json.dumps({"op": "gemm", "m": 16, "n": 5120, "k": 5120, "dtype": "fp8"}) + "\n")
    assert kernel_main(["--device", "a100", "--engine", "trtllm", "--jsonl", str(rows)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_quantization_config_readers():
    assert matches("model.layers.*.self_attn", "model.layers.3.self_attn.q_proj")
    assert matches("mlp.gate", "model.layers.3.mlp.gate") and not matches("mlp.gate", "model.layers.3.mlp.gate_proj")
    assert matches("re:.*mlp.gate$", "model.layers.3.mlp.gate") and not matches("lm_head", "model.lm_headx")
    ct = checkpoint_formats({"quantization_config": {
        "quant_method": "compressed-tensors", "ignore": ["lm_head", "re:.*mlp.gate$"],
        "config_groups": {"rest": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int"}},
                          "attn": {"targets": ["re:.*self_attn.*"], "weights": {"num_bits": 8, "type": "float"}}}}})
    assert ct.headline == "int4"   # a regex target wins over the class target for the layers it names:
    assert ct.format_of("model.layers.1.self_attn.q_proj", "linear") == "fp8"
    assert ct.format_of("model.layers.1.mlp.down_proj", "linear") == "int4"
    assert ct.format_of("model.layers.1.mlp.gate", "router") == "bf16"
    assert ct.format_of("lm_head", "lm_head") == "bf16"
    awq = checkpoint_formats({"quantization_config": {"quant_method": "awq", "bits": 4,
                                                      "modules_to_not_convert": ["visual"]}})
    assert awq.format_of("model.visual.proj", "linear") == "bf16" and awq.format_of("model.x", "linear") == "int4"
    gptq = checkpoint_formats({"quantization_config": {"quant_method": "gptq", "bits": 8, "lm_head": True}})
    assert gptq.format_of("lm_head", "lm_head") == "int8_wo"   # W8A16: weight-only (gptq_marlin)
    w8a16 = checkpoint_formats({"quantization_config": {"quant_method": "compressed-tensors", "config_groups": {
        "g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "int"}}}}})
    assert w8a16.headline == "int8_wo"
    f = run_format("int8_wo", "linear", "vllm", load_profile("a100"), moe=False)
    assert (f.kernel, f.weight_bytes, f.how) == ("bf16", 1.0, "weight-only")
    assert checkpoint_formats({"quantization_config": {"quant_method": "mxfp4"}}).format_of(
        "model.layers.0.self_attn.q_proj", "linear") == "bf16"


def test_an_ignore_list_naming_one_layer_splits_its_repeated_layers(tmp_path):
    cfg = dict(resolve_model("llama-3.2-1b").config)
    cfg["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128],
                                  "modules_to_not_convert": ["model.layers.0.mlp.down_proj"]}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    t = trace(str(tmp_path), DECODE)
    down = {op.weight_format: op.count for op in t.ops if op.weight_module and op.weight_module.endswith("down_proj")}
    assert down == {"bf16": 1, "fp8_block": cfg["num_hidden_layers"] - 1}


def test_an_unread_quantization_config_says_so(tmp_path):
    cfg = dict(resolve_model("llama-3.2-1b").config, quantization_config={"quant_method": "eetq"})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    t = trace(str(tmp_path), DECODE)
    assert t.options.dtype == "bf16" and any("quant_method 'eetq') not read" in n for n in t.notes)


def test_vllm_lays_out_mxfp4_experts_larger_than_stored_on_hopper():
    """vLLM logs 'Model loading took 65.9651 GiB' for gpt-oss-120b on one H100 under 0.10.1 (Marlin, the backend of
    the releases tracecost models: triton_kernels became a dependency after 0.11.0): its expert layout holds 1.093x
    the checkpoint's bytes, which the KV cache does not get. A100 and SGLang keep the stored bytes."""
    from cost.op_formats import expert_resident
    from serving.capacity import weight_bytes_per_gpu
    t = trace("gpt-oss-120b", DECODE)
    h100, a100 = load_profile("h100"), load_profile("a100")
    assert expert_resident(t, "vllm", h100) == pytest.approx(1.093)
    assert expert_resident(t, "vllm", a100) == expert_resident(t, "sglang", h100) == 1.0
    assert expert_resident(trace("qwen3-30b-a3b-2507-fp8", DECODE), "vllm", h100) == 1.0
    gib = weight_bytes_per_gpu(t, expert_resident=expert_resident(t, "vllm", h100)) / 2**30
    assert gib == pytest.approx(65.97, abs=0.1)
    assert weight_bytes_per_gpu(t) / 2**30 == pytest.approx(60.71, abs=0.05)
    note = next(n for n in estimate(t, h100, engine="vllm").notes if n.startswith("formats: mxfp4"))
    assert "held at 1.093x their stored bytes in vLLM's layout" in note
