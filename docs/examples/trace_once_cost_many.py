"""Trace a model once, then price that trace on several devices, tensor-parallel sizes and engines.

    python docs/examples/trace_once_cost_many.py

A trace is device independent: the model is built and run on the meta device once per step shape, and every
estimate below reuses it. See docs/python_api.md.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # run from a checkout without installing

from cost.estimate import Parallelism, estimate  # noqa: E402
from cost.profile import load_profile  # noqa: E402
from tracer import Request, TraceOptions, resolve_model, trace  # noqa: E402
from tracer.table import format_table  # noqa: E402


def main() -> list[dict]:
    spec = resolve_model("llama-3.1-8b")   # a bundled name; a Hub id, a folder or a config.json path work too
    options = TraceOptions(dtype="auto", kv_cache_dtype="fp8")
    decode = trace(spec, Request(num_queries=64, query_length=1, context_length=2048, decode=True), options)
    prefill = trace(spec, Request(num_queries=1, query_length=4096), options)
    rows, notes = [], set()
    for device in ("h100", "h200", "b200"):
        hw = load_profile(device)
        for tp in (1, 2):
            # engine: vLLM's fitted kernels (the default engine); eager: HF transformers' unfused kernels
            for execution in ("engine", "eager"):
                par = Parallelism(tp=tp)
                step = estimate(decode, hw, execution, par, engine="vllm")
                ttft = estimate(prefill, hw, execution, par, engine="vllm")
                notes.update(step.notes)
                rows.append({"device": hw.name, "tp": tp, "execution": execution, "tpot_ms": step.wall_s * 1e3,
                             "ttft_ms": ttft.wall_s * 1e3, "decode_tokens_per_s": 64 / step.wall_s})
    print(format_table(["device", "TP", "execution", "TPOT ms (batch 64, ctx 2048)", "TTFT ms (4096 tokens)",
                        "decode tokens/s"],
                       [[r["device"], r["tp"], r["execution"], f"{r['tpot_ms']:.2f}", f"{r['ttft_ms']:.1f}",
                         f"{r['decode_tokens_per_s']:,.0f}"] for r in rows],
                       title=f"{spec.name}: one trace per step shape ({decode.num_ops} + {prefill.num_ops} ops), "
                             f"priced {len(rows)} ways"))
    for note in sorted(notes):
        print(f"note: {note}")
    return rows


if __name__ == "__main__":
    main()
