"""GPU probe for the two open accuracy questions of the H200 calibration set (run it where a GPU is lent).

    OUT=/tmp/probe python bench/gpu_routing_probe.py            # on a CUDA machine, ~3 minutes
    TINY=1 python bench/gpu_routing_probe.py                    # a tiny model on the CPU, to check the script

1. MoE routing: for qwen3-30b-a3b prefill (512 / 2048 new tokens, 0 or 2048 cached), as gpu_truth.py builds it
   (random weights, bf16, grouped_mm experts, a StaticCache whose context was never written), record per layer the
   tokens each expert received: active experts and the busiest expert's load against balanced routing, next to the
   grouped-GEMM kernel time. Balanced routing predicts ~128 active experts at 512 tokens; the measured kernel time
   implies fewer.
2. Clocks: SM clock and power before and after dense (llama-3.1-8b) and MoE (qwen3-30b-a3b) prefill at 8192 tokens,
   to test whether the 20-25% faster attention of qwen3-30b-a3b comes from a different power draw.
Writes $OUT/routing_probe.json.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TINY = os.environ.get("TINY") == "1"
DEVICE = "cuda" if torch.cuda.is_available() and not TINY else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32
OUT = Path(os.environ.get("OUT") or "/tmp/routing_probe")


def model_config(name: str) -> dict:
    configs = json.loads((ROOT.parent / "shared" / "measurements" / "h200" / "model_configs.json").read_text())
    cfg = dict(configs[name])
    if TINY:
        cfg.update(num_hidden_layers=2, hidden_size=64, intermediate_size=128, vocab_size=1000,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16)
        if "num_experts" in cfg:
            cfg.update(num_experts=16, num_experts_per_tok=4, moe_intermediate_size=32)
    return cfg


def sdpa_lower_right(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The attention gpu_truth.py registers: no repeated KV heads, causal aligned to the end."""
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right
    q_len, kv_len = query.shape[2], key.shape[2]
    gqa = query.shape[1] != key.shape[1]
    if q_len == kv_len:
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling, enable_gqa=gqa)
    else:
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=causal_lower_right(q_len, kv_len),
                                             scale=scaling, enable_gqa=gqa)
    return out.transpose(1, 2).contiguous(), None


def build(name: str):
    from transformers import AttentionInterface, AutoConfig, AutoModelForCausalLM
    AttentionInterface.register("probe_sdpa", sdpa_lower_right)
    spec = model_config(name)
    cfg = AutoConfig.for_model(spec.pop("model_type"), **spec)
    kwargs = {"experts_implementation": "grouped_mm" if DEVICE == "cuda" else "eager"} \
        if getattr(cfg, "num_experts", None) else {}
    with torch.device(DEVICE):
        model = AutoModelForCausalLM.from_config(cfg, dtype=DTYPE, attn_implementation="probe_sdpa", **kwargs)
    return model.eval(), cfg


def clocks() -> dict:
    if DEVICE != "cuda":
        return {}
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return {"sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000}
    except Exception as e:  # noqa: BLE001 - the probe reports what it could not read
        return {"error": repr(e)[:200]}


def forward(model, cfg, batch: int, query: int, context: int):
    from transformers import StaticCache
    cache = StaticCache(config=cfg, max_cache_len=context + query)
    ids = torch.randint(0, cfg.vocab_size, (batch, query), device=DEVICE)
    pos = torch.arange(context, context + query, device=DEVICE)
    with torch.no_grad():
        model(input_ids=ids, past_key_values=cache, cache_position=pos, position_ids=pos.unsqueeze(0).expand(batch, -1),
              use_cache=True, logits_to_keep=1)
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def routing(model, cfg, query: int, context: int) -> dict:
    loads = []

    def hook(module, args, output):
        indices = output[2] if isinstance(output, tuple) else output
        counts = torch.bincount(indices.reshape(-1), minlength=cfg.num_experts).float()
        loads.append(counts.cpu())

    routers = [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]
    handles = [r.register_forward_hook(hook) for r in routers]
    try:
        forward(model, cfg, 1, query, context)
    finally:
        for h in handles:
            h.remove()
    balanced = query * cfg.num_experts_per_tok / cfg.num_experts
    active = [int((c > 0).sum()) for c in loads]
    busiest = [float(c.max()) / balanced for c in loads]
    return {"query": query, "context": context, "layers": len(loads), "active_experts_mean": sum(active) / len(active),
            "active_experts_min": min(active), "busiest_over_balanced_mean": sum(busiest) / len(busiest),
            "expected_active_balanced": cfg.num_experts * (1 - (1 - cfg.num_experts_per_tok / cfg.num_experts) ** query)}


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    result = {"device": torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu", "tiny": TINY,
              "routing": [], "clocks": []}
    model, cfg = build("qwen3-30b-a3b")
    for query, context in [(512, 0), (2048, 0), (2048, 2048), (256, 3840)]:
        if TINY:
            query, context = query // 64, context // 64
        result["routing"].append(routing(model, cfg, query, context))
        print(result["routing"][-1], flush=True)
    for name in ("qwen3-30b-a3b", "llama-3.1-8b"):  # the MoE model is already built
        if name != "qwen3-30b-a3b":
            del model
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
            model, cfg = build(name)
        q = 64 if TINY else 8192
        before = clocks()
        start = time.perf_counter()
        for _ in range(3):
            forward(model, cfg, 1, q, 0)
        result["clocks"].append({"model": name, "query": q, "before": before, "after": clocks(),
                                 "seconds_per_forward": (time.perf_counter() - start) / 3})
        print(result["clocks"][-1], flush=True)
    (OUT / "routing_probe.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {OUT / 'routing_probe.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
