"""Engine and server setups beyond the kernels: named server topologies, fused activation quantization,
L2-resident attention operands, and the limits trtllm-bench builds an engine with."""
from dataclasses import replace

import numpy as np
import pytest

from cost.engine_kernels import DecodeAttentionParams, PrefillAttentionParams, allreduce_time
from cost.engine_kernels.attention import decode_attention_time, prefill_attention_time
from cost.engine_pricing import price_engine_kernel
from cost.op_formats import RunFormat
from cost.estimate import Parallelism, engine_allreduce_seconds, estimate
from cost.execution import ENGINE, build_kernels
from cost.profile import ProfileError, load_profile
from cost.profile_schema import Link, Topology
from serving.published import trtllm_bench_limits
from tracer import Request, TraceOptions, trace


def test_a_named_topology_replaces_the_measured_all_reduce():
    base, switch = load_profile("l40s"), load_profile("l40s:pcie-switch")
    assert switch.topology == "pcie-switch" and switch.pcie_only
    message = 16 * 2**20
    slow, fast = (engine_allreduce_seconds(message, 8, hw, "vllm") for hw in (base, switch))
    assert fast < slow / 5          # 1.5 GB/s measured at 8 GPUs vs the 20 GB/s of a peer-to-peer pair
    # two GPUs were peer-to-peer on the measured server too: unchanged
    assert engine_allreduce_seconds(message, 2, base, "vllm") == engine_allreduce_seconds(message, 2, switch, "vllm")
    notes: list[str] = []
    engine_allreduce_seconds(message, 4, base, "vllm", notes)
    assert any("l40s:pcie-switch" in n for n in notes)     # the measured topology says there is another
    with pytest.raises(ProfileError, match="has no topology 'nvswitch'"):
        load_profile("l40s:nvswitch")
    with pytest.raises(ProfileError, match="no topology"):
        load_profile("h100:pcie-switch")
    with pytest.raises(ProfileError, match="already names its topology"):
        load_profile("l40s:pcie-switch:pcie-switch")


def test_gpus_without_peer_to_peer_all_reduce_through_nccl():
    """A pair that cannot map each other's memory (vLLM: "Custom allreduce is disabled because your platform lacks
    GPU P2P capability") runs no custom all-reduce: every message takes NCCL's curve."""
    bridged, p2p, none = (load_profile(d) for d in ("h100pcie", "h100pcie:pcie", "h100pcie:no-p2p"))
    assert "custom" in p2p.engine("vllm").allreduce and "custom" not in none.engine("vllm").allreduce
    assert none.pcie_only and not bridged.pcie_only
    geforce = load_profile("rtx4090")          # NVIDIA's driver gives GeForce RTX 4090s no P2P: its own link says so
    assert not geforce.peer_to_peer and set(geforce.engine("vllm").allreduce) == {"nccl"}
    assert load_profile("l40s").peer_to_peer and "custom" in load_profile("l40s").engine("vllm").allreduce
    nccl = p2p.engine("vllm").allreduce["nccl"][2]
    for message in (2**14, 2**20, 4 * 2**20):     # a decode's, a 64-token verification's, a prefill chunk's
        assert engine_allreduce_seconds(message, 2, none, "vllm") == allreduce_time(nccl, message, 2).seconds
        assert engine_allreduce_seconds(message, 2, none, "vllm") > engine_allreduce_seconds(message, 2, p2p, "vllm")
        assert engine_allreduce_seconds(message, 2, p2p, "vllm") > engine_allreduce_seconds(message, 2, bridged,
                                                                                            "vllm")
    notes: list[str] = []
    engine_allreduce_seconds(2**14, 2, none, "vllm", notes)
    engine_allreduce_seconds(2**20, 2, none, "vllm", notes)
    assert len(notes) == 1 and "no custom all-reduce without peer-to-peer" in notes[0]   # said once, not per call
    with pytest.raises(ValueError, match="without peer_to_peer runs no custom all-reduce"):
        Topology(description="x", interconnect=Link(bandwidth_gbps=64.0, latency_us=10.0, peer_to_peer=False),
                 allreduce={"custom": {"2": {}}, "nccl": {"2": {}}})


def test_only_pcie_interconnects_limit_the_custom_all_reduce():
    assert load_profile("l40s").pcie_only and not load_profile("h100").pcie_only
    assert not load_profile("mi300x").pcie_only


def test_trtllm_fuses_fp8_activation_quantization():
    hw = load_profile("h100")
    t = trace("llama-3.1-8b", Request(64, 1, 2048, decode=True), TraceOptions(dtype="fp8"))
    gemm = next(k for k in build_kernels(t, ENGINE, 1, 1) if k.op_class == "gemm" and k.gemm is not None)
    trtllm = hw.engine("trtllm")
    fused = price_engine_kernel(gemm, hw, trtllm, RunFormat("fp8", 1.0, "fp8"), 1.0).seconds
    unfused = price_engine_kernel(gemm, hw, replace(trtllm, engine="vllm"), RunFormat("fp8", 1.0, "fp8"), 1.0).seconds
    assert fused < unfused           # same fitted GEMM, without the quantization pass the tables time with it
    bf16 = estimate(trace("llama-3.1-8b", Request(64, 1, 2048, decode=True), TraceOptions()), hw, "engine",
                    Parallelism(1), engine="trtllm").latency_s
    assert estimate(t, hw, "engine", Parallelism(1), engine="trtllm").latency_s < bf16


def test_trtllm_fuses_nvfp4_activation_quantization_on_blackwell():
    """TensorRT-LLM's norms and SwiGLU write NVFP4 (with its block scales) for the GEMM after them, as they write FP8;
    vLLM quantizes in a kernel of its own."""
    hw = load_profile("b200")
    t = trace("llama-3.1-8b", Request(256, 1, 2048, decode=True), TraceOptions(dtype="fp4"))
    gemm = next(k for k in build_kernels(t, ENGINE, 1, 1) if k.op_class == "gemm" and k.gemm is not None)
    trtllm = hw.engine("trtllm")
    fmt = RunFormat("nvfp4", 1.0, "nvfp4")
    fused = price_engine_kernel(gemm, hw, trtllm, fmt, 1.0).seconds
    unfused = price_engine_kernel(gemm, hw, replace(trtllm, engine="vllm"), fmt, 1.0).seconds
    assert trtllm.gemm["nvfp4"].quant_passes > 0 and fused < unfused


def test_fresh_prefill_operands_stream_from_l2_while_they_fit():
    p = PrefillAttentionParams(l2_speedup=4.0, l2_fraction=1.0, compute=1.0, write_token_ns=0.0)
    args = (142, 362e12, 91.6e12, 864e9, 96e6)
    def memory_s(params, batch):
        return float(prefill_attention_time(params, *args, batch, 64, 0, 32, 32, 128).memory_s)
    neutral = PrefillAttentionParams(l2_speedup=1.0, l2_fraction=1.0, compute=1.0, write_token_ns=0.0)
    assert memory_s(p, 4) < 0.4 * memory_s(neutral, 4)          # 8 MB of Q/K/V/O: L2 serves it
    assert memory_s(p, 1024) > 0.9 * memory_s(neutral, 1024)    # 2 GB: HBM
    assert np.isfinite(memory_s(p, 1))


def test_strided_kv_layout_costs_once_batch_and_kv_heads_exceed_one():
    p = DecodeAttentionParams(strided_us=6.0)
    def us(batch, kv_heads):
        return float(decode_attention_time(p, 108, 2.0e12, 40e6, batch, 16, 32, kv_heads, 128).seconds) * 1e6
    assert us(2, 2) - us(2, 1) > 5.5 and abs(us(1, 2) - us(1, 1)) < 0.5


@pytest.mark.parametrize("kv_tokens, isl, osl, expected", [
    (200 * 5500, 5000, 500, (224, 2304)),        # 200 requests fit: batch to 32s, tokens to 256s, >= 2048
    (10**9, 128, 128, (4096, 8192)),             # at most 4096 requests
    (10**9, 20000, 2000, (4096, 32768)),         # at most 32768 tokens
    (30 * 1100, 1000, 100, (64, 2048)),          # at least 64 requests and 2048 tokens
    (600 * 1000, 500, 500, (640, 2048)),         # 600 requests: batch to 128s
    (2000 * 3000, 1000, 2000, (2048, 3072)),     # 2000 requests: batch to 256s; 3000 tokens to 256s
    (1000 * 600, 500, 100, (1024, 6144)),        # 6000 tokens: to 512s
])
def test_trtllm_bench_limits_follow_its_rounding(kv_tokens, isl, osl, expected):
    assert trtllm_bench_limits(kv_tokens, isl, osl) == expected


def test_l2_sizes_are_binary_megabytes():
    """Vendors state cache sizes in MiB (CUDA reports A100's "40 MB" L2 as 41,943,040 bytes). The fitted
    `l2_fraction`s were rescaled by 1e6 / 2^20 when the unit changed, so each set still puts its residency edge
    where its fit did: H100's SGLang bf16 decode, fitted at 0.9614 of 50e6 bytes, still at 45.8 MiB (a set refitted
    since, as RTX PRO 6000's SGLang decode, puts its edge where the new fit does)."""
    from cost.profile import load_profile
    assert load_profile("a100").l2_bytes == 40 * 2**20
    hw = load_profile("h100")
    p = hw.engine("sglang").decode_attention["bf16"]
    edge = hw.l2_bytes * p.l2_fraction / 2**20
    assert edge == pytest.approx(0.9614 * 50e6 / 2**20, abs=0.01)
