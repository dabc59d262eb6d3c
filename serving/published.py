"""Published end-to-end serving measurements (../shared/measurements/e2e/published.jsonl, its README says
what each field means), mapped to tracecost setups and predicted with the steady-state model.

A row becomes: a bundled model, a device profile, an engine, weight and KV formats, a layout, fixed input
and output lengths, and a load (an open-loop rate, or every request queued at once). Rows tracecost cannot
map (a model it does not bundle, a layout it does not price) are skipped with the reason.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from cost.engines import ENGINES, ServingOverheads
from cost.estimate import Parallelism
from cost.profile import load_profile
from tracer.model_source import resolve_model
from tracer.work import TraceOptions

from .steady_state import MAX, RATE, Limits, Load, SteadyState, solve
from .step_cost import StepCost

MODELS = {"meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b", "meta-llama/Llama-3.1-70B-Instruct": "llama-3.1-70b",
          "meta-llama/Llama-3.1-405B-Instruct": "llama-3.1-405b", "mistralai/Mistral-7B-Instruct-v0.3": "mistral-7b",
          "mistralai/Mixtral-8x7B-Instruct-v0.1": "mixtral-8x7b", "mistralai/Mixtral-8x22B-Instruct-v0.1": "mixtral-8x22b"}
# NVIDIA's L40S runs reach every GPU peer-to-peer (their TP4/TP8 throughput is out of reach at the 4/8-GPU
# bandwidth of the server the kernel tables were measured on): hw_profiles/l40s.json, topology pcie-switch
DEVICES = {"H100-SXM-80GB": "h100", "H200-SXM-141GB": "h200", "A100-SXM4-80GB": "a100",
           "L40S-48GB": "l40s:pcie-switch", "B200-SXM-180GB": "b200"}
ENGINE_NAMES = {"tensorrt-llm": "trtllm", "vllm": "vllm", "sglang": "sglang"}
METRICS = ("ttft_ms", "tpot_ms", "output_tok_s")


@dataclass(frozen=True)
class PublishedRun:
    id: str
    source_kind: str
    model: str
    device: str
    engine: str
    dtype: str
    kv_dtype: str | None
    tp: int
    isl: int
    osl: int
    load: Load
    memory_fraction: float | None
    measured: dict = field(default_factory=dict)     # ttft_ms, tpot_ms, output_tok_s (what the row reports)
    trtllm_bench: bool = False   # the engine was built by trtllm-bench, which sizes its limits from the dataset


def _engine(text: str) -> str | None:
    text = text.lower()
    return next((name for key, name in ENGINE_NAMES.items() if key in text), None)


def load_published(path: str) -> tuple[list[PublishedRun], list[tuple[str, str]]]:
    """(runs tracecost can predict, [(id, why not)] for the rest)."""
    runs, skipped = [], []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        why = None
        model, device, engine = MODELS.get(r["model"]), DEVICES.get(r["gpu"]), _engine(r.get("engine") or "")
        if model is None:
            why = f"model {r['model']} is not bundled"
        elif device is None:
            why = f"no profile for {r['gpu']}"
        elif engine is None:
            why = f"engine {r.get('engine')} has no kernel models"
        elif (r.get("pp") or 1) != 1 or r.get("disaggregated") or r.get("attention_dp"):
            why = "layout not priced (pipeline, disaggregated or attention-DP)"
        if why:
            skipped.append((r["id"], why))
            continue
        if r.get("request_rate"):
            load = Load(RATE, float(r["request_rate"]), requests=int(r.get("num_requests") or 0))
        else:
            load = Load(MAX, requests=int(r.get("num_requests") or 0))
        dtype = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8"}.get(r["precision"], "bf16")
        fraction = re.search(r"kv_cache_free_gpu_mem_fraction\s*([0-9.]+)", r.get("engine_flags") or "")
        measured = {}
        if (r.get("ttft_ms") or {}).get("mean") is not None:
            measured["ttft_ms"] = r["ttft_ms"]["mean"]
        latency = (r.get("tpot_ms") or {}).get("mean") or (r.get("itl_ms") or {}).get("mean")
        if latency is not None:
            measured["tpot_ms"] = latency
        if r.get("output_tok_s") is not None:
            measured["output_tok_s"] = r["output_tok_s"]
        runs.append(PublishedRun(r["id"], r["source_kind"], model, device, engine, dtype, r.get("kv_cache_dtype"),
                                 int(r["tp"]), int(r["isl"]), int(r["osl"]), load,
                                 float(fraction.group(1)) if fraction else None, measured,
                                 "trtllm-bench" in (r.get("engine_flags") or "")))
    return runs, skipped


def trtllm_bench_limits(kv_tokens: int, isl: int, osl: int) -> tuple[int, int]:
    """The (max batch size, max num tokens) trtllm-bench builds an engine with for a dataset of isl/osl
    requests (tensorrt_llm/bench/build/tuning.py): as many requests as the KV cache holds at isl + osl tokens
    (at most 4096), the tokens a step needs to keep them fed (at most 32768), both rounded up to coarse steps."""
    requests = min(kv_tokens / (isl + osl), 4096)
    tokens = min(requests * (1 + isl / osl), 32768)
    step = 32 if requests < 256 else 128 if requests < 1024 else 256
    seqs = max(64, step * math.ceil(requests / step)) if requests < 256 else step * math.ceil(requests / step)
    step = 256 if tokens < 4096 else 512 if tokens < 8192 else 1024
    return seqs, max(2048, step * math.ceil(tokens / step))


class Predictor:
    """Predicts published runs; step shapes are traced and priced once per (model, device, formats, layout)."""

    def __init__(self):
        self._costs: dict = {}

    def cost(self, run: PublishedRun) -> StepCost:
        key = (run.model, run.device, run.engine, run.dtype, run.kv_dtype, run.tp)
        if key not in self._costs:
            spec, hw = resolve_model(run.model), load_profile(run.device)
            options = TraceOptions(dtype=run.dtype, kv_cache_dtype=run.kv_dtype)
            # the TensorRT-LLM runs of this set shard MoE experts by TP (no EP stated), as vLLM does by default
            self._costs[key] = StepCost(spec, hw, options, "engine", Parallelism(run.tp), run.engine)
        return self._costs[key]

    def predict(self, run: PublishedRun, overheads: ServingOverheads | None = None) -> tuple[dict, SteadyState]:
        cost = self.cost(run)
        if overheads is not None:
            cost.overheads = overheads
        o = cost.overheads
        d = cost.defaults
        kv_tokens = cost.replica_memory(d.max_batched_tokens, run.memory_fraction).kv_tokens
        if run.trtllm_bench:
            seqs, tokens = trtllm_bench_limits(kv_tokens, run.isl, run.osl)
            kv_tokens = cost.replica_memory(tokens, run.memory_fraction).kv_tokens
            limits = Limits(seqs, tokens, kv_tokens, d.chunked_prefill or tokens < run.isl)
        else:
            limits = Limits(d.max_num_seqs, d.max_batched_tokens, kv_tokens, d.chunked_prefill)
        state = solve(cost.steady, run.isl, run.osl, 0, run.load, limits, o.request_ms * 1e-3)
        return {"ttft_ms": state.ttft_s["mean"] * 1e3, "tpot_ms": state.tpot_s * 1e3,
                "output_tok_s": state.output_tokens_per_s}, state


__all__ = ["ENGINES", "METRICS", "Predictor", "PublishedRun", "load_published"]
