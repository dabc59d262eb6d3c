"""The serving settings a run's launch flags state, in one typed record.

Published runs give their engine's command line (`vllm serve ... --max-num-seqs 256`, SGLang's
`--max-running-requests`, the MLPerf harness's `gpu_batch_size={'llama2-70b': 1024}; max_num_tokens=4096`).
A stated setting replaces the engine's default; an unstated one stays the default. One registry maps each
flag, whatever engine spells it, to the setting it sets.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class StatedSettings:
    max_num_seqs: int | None = None          # requests running at once
    max_batched_tokens: int | None = None    # tokens per step (chunked-prefill budget)
    memory_fraction: float | None = None     # the engine's memory budget (its own meaning: of total or of free)
    kv_cache_dtype: str | None = None
    expert_parallel: bool = False            # experts sharded over the whole TP x DP group
    chunked_prefill: bool | None = None
    scheduler_steps: int = 1                 # vLLM's multi-step scheduling: one schedule per this many decodes
    api_server: bool = False                 # requests come through the engine's HTTP server (not its Python API)
    api_servers: int = 1                     # processes taking requests in (vLLM's --api-server-count)
    power_limit_w: float | None = None       # a board power cap set on every GPU (nvidia-smi -pl), W
    capacity_scheduler: str | None = None    # TensorRT-LLM's KV admission policy (serving/capacity.py KV_ADMISSION)
    mixed_chunk: bool = False                # SGLang mixes prefill chunks into the decode steps


def _capacity_scheduler(value: str) -> str:
    """TensorRT-LLM's capacity-scheduler policy as each launcher spells it: the MLPerf harness's max_util /
    no_evict, the executor's MAX_UTILIZATION / GUARANTEED_NO_EVICT, Triton's older guaranteed_completion."""
    v = value.lower()
    if v in ("max_util", "max_utilization"):
        return "max_utilization"
    if v in ("no_evict", "guaranteed_no_evict", "guaranteed_completion"):
        return "guaranteed_no_evict"
    raise ValueError(value)


# flag (as any engine spells it) -> (setting, parser of its value); a switch (no value, or true/false) parses
# SWITCH, a negative switch NEGATED
_INT, _FLOAT, SWITCH, NEGATED = int, float, "switch", "negated"
FLAGS: dict[str, tuple[str, object]] = {
    "--max-num-seqs": ("max_num_seqs", _INT),                   # vLLM
    "--max-running-requests": ("max_num_seqs", _INT),           # SGLang
    "--max_batch_size": ("max_num_seqs", _INT),                 # TensorRT-LLM
    "--max-batch-size": ("max_num_seqs", _INT),
    "gpu_batch_size": ("max_num_seqs", _INT),                   # MLPerf harness: {'model': N}
    "--max-num-batched-tokens": ("max_batched_tokens", _INT),   # vLLM
    "--chunked-prefill-size": ("max_batched_tokens", _INT),     # SGLang
    "--max_num_tokens": ("max_batched_tokens", _INT),           # TensorRT-LLM
    "--max-num-tokens": ("max_batched_tokens", _INT),
    "max_num_tokens": ("max_batched_tokens", _INT),             # MLPerf harness
    "--gpu-memory-utilization": ("memory_fraction", _FLOAT),    # vLLM: of total memory
    "--mem-fraction-static": ("memory_fraction", _FLOAT),       # SGLang: of total memory
    "--kv_cache_free_gpu_memory_fraction": ("memory_fraction", _FLOAT),   # TensorRT-LLM: of free memory
    "kv_cache_free_gpu_mem_fraction": ("memory_fraction", _FLOAT),
    "kvcache_free_gpu_mem_frac": ("memory_fraction", _FLOAT),   # MLPerf harness
    "--kv-cache-dtype": ("kv_cache_dtype", str),
    "--enable-expert-parallel": ("expert_parallel", SWITCH),
    "--enable-chunked-prefill": ("chunked_prefill", SWITCH),
    "--enable-mixed-chunk": ("mixed_chunk", SWITCH),            # SGLang
    "--no-enable-chunked-prefill": ("chunked_prefill", NEGATED),
    "--num-scheduler-steps": ("scheduler_steps", _INT),
    "--api-server-count": ("api_servers", _INT),                # vLLM
    "power_limit": ("power_limit_w", _FLOAT),                   # MLPerf harness (MaxQ systems)
    "--scheduler_policy": ("capacity_scheduler", _capacity_scheduler),       # TensorRT-LLM gptManagerBenchmark
    "capacity_scheduler_policy": ("capacity_scheduler", _capacity_scheduler),  # LLM API scheduler_config
    "batch_scheduler_policy": ("capacity_scheduler", _capacity_scheduler),     # Triton backend, MLPerf configs
    "trtllm_batch_sched_policy": ("capacity_scheduler", _capacity_scheduler),  # MLPerf harness_llm flag
}
# what a launcher sets where its launch line is silent: NVIDIA's MLPerf LLM harness (harness_llm, main_llm.cc of
# mlcommons/inference_results_v4.0 closed/NVIDIA) defaults --trtllm_batch_sched_policy to max_util, and its v4.x
# llama2-70b / mixtral configs leave it unset. (Its Triton harness is not stored: those rows keep the engine's.)
LAUNCHER_DEFAULTS = {"TensorRT-LLM (NVIDIA MLPerf harness)": {"capacity_scheduler": "max_utilization"}}
# launch lines that start an engine's OpenAI-compatible HTTP server: its requests pass the server's frontend
SERVER_LAUNCHES = (re.compile(r"\bvllm\s+serve\b"), re.compile(r"vllm\.entrypoints\.openai"),
                   re.compile(r"sglang\.launch_server"), re.compile(r"\btrtllm-serve\b"))
_VALUE = r"\s*(?:=|:|\s)\s*(?:\{[^}]*?:\s*)?['\"]?([A-Za-z0-9_.]+)"


def stated_settings(flags: str | None, launcher: str | None = None) -> StatedSettings:
    """The settings a launch line states (unknown flags are left to the engine's defaults); the first flag in
    FLAGS that states a setting sets it. `launcher`: the tool that started the engine, as a row names it
    (LAUNCHER_DEFAULTS: what it sets where the line is silent)."""
    out, stated = StatedSettings(**LAUNCHER_DEFAULTS.get(launcher or "", {})), set()
    for flag, (name, parse) in FLAGS.items():
        if not flags or name in stated:
            continue
        switch = parse in (SWITCH, NEGATED)
        pattern = re.escape(flag) + (r"(?![\w-])(?:\s*[= ]\s*(true|false)\b)?" if switch else _VALUE)
        m = re.search(r"(?<![\w-])" + pattern, flags, flags=re.IGNORECASE if switch else 0)
        if m is None:
            continue
        if switch:
            value = (m.group(1) or "true").lower() == "true"
            value = not value if parse == NEGATED else value
        else:
            try:
                value = parse(m.group(1))
            except ValueError:
                continue            # a placeholder ($BS) states nothing
        out = replace(out, **{name: value})
        stated.add(name)
    if flags and any(p.search(flags) for p in SERVER_LAUNCHES):
        out = replace(out, api_server=True)
    return out


__all__ = ["FLAGS", "LAUNCHER_DEFAULTS", "NEGATED", "SERVER_LAUNCHES", "SWITCH", "StatedSettings", "stated_settings"]
