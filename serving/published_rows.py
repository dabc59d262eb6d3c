"""Published end-to-end serving measurements (../shared/measurements/e2e/*.jsonl, their README says what each
field means) mapped to tracecost setups; serving/published.py predicts them with the steady-state model.

A row becomes: a bundled model, a device profile, an engine and its release, weight and KV formats, a layout
(TP, EP, DP replicas), the lengths, the engine limits its flags state, and a load:
- `offline_max_throughput`: every request queued at once (a finite burst of `num_requests`);
- `online_request_rate` at a rate: Poisson arrivals split round robin over the DP replicas; with no rate
  (`vllm bench serve`'s default, rate inf): a finite burst, every prompt sent at once;
- `online_concurrency`: a closed loop of that many users over the run's `num_requests` (its ramp and drain
  walked), their sends paced at `request_rate` where one is stated;
- `offline_batch` (`benchmark_latency.py`): one batch of `batch_size` requests, measured as its whole time.
Rows tracecost cannot map (a model it does not bundle, a GPU with no profile, a layout it does not price) are
skipped with the reason.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path

from tracer.model_source import bundled_models, resolve_model

from .engine_flags import stated_settings
from .measurements import harness_weights, streamed, system_device, system_kv_dtype
from .speculative import Speculation, parse_speculation
from .steady_state import CONCURRENCY, MAX, RATE, Load

# HF ids -> bundled configs; a fine-tune or re-release of the same architecture maps to its base
MODELS = {"meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b", "meta-llama/Llama-3.1-70B-Instruct": "llama-3.1-70b",
          "meta-llama/Llama-3.3-70B-Instruct": "llama-3.1-70b",     # the 3.1-70B architecture, retrained
          "meta-llama/Llama-3.1-405B-Instruct": "llama-3.1-405b", "meta-llama/Llama-2-70b-chat-hf": "llama-2-70b",
          "mistralai/Mistral-7B-Instruct-v0.3": "mistral-7b",
          "mistralai/Mixtral-8x7B-Instruct-v0.1": "mixtral-8x7b", "mistralai/Mixtral-8x22B-Instruct-v0.1": "mixtral-8x22b",
          "Qwen/Qwen3-8B": "qwen3-8b", "Qwen/Qwen3-14B": "qwen3-14b", "Qwen/Qwen3-32B": "qwen3-32b",
          "Qwen/Qwen3-235B-A22B-Instruct-2507": "qwen3-235b-a22b", "Qwen/Qwen3-235B-A22B": "qwen3-235b-a22b",
          "Qwen/Qwen3-30B-A3B": "qwen3-30b-a3b", "openai/gpt-oss-20b": "gpt-oss-20b",
          "openai/gpt-oss-120b": "gpt-oss-120b", "deepseek-ai/DeepSeek-R1-0528": "deepseek-v3",   # V3's architecture
          "deepseek-ai/DeepSeek-R1": "deepseek-v3", "deepseek-ai/DeepSeek-V3": "deepseek-v3",
          "deepseek-ai/DeepSeek-V3.2": "deepseek-v3.2",
          "zai-org/GLM-4.5-Air": "glm-4.5-air", "zai-org/GLM-4.6": "glm-4.6",
          "meta-llama/Llama-3.2-1B": "llama-3.2-1b", "meta-llama/Llama-3.2-1B-Instruct": "llama-3.2-1b",
          "meta-llama/Llama-4-Maverick-17B-128E-Instruct": "llama-4-maverick",
          "meta-llama/Llama-4-Scout-17B-16E-Instruct": "llama-4-scout"}
# NVIDIA's L40S runs reach every GPU peer-to-peer (their TP4/TP8 throughput is out of reach at the 4/8-GPU
# bandwidth of the server the kernel tables were measured on): hw_profiles/l40s.json, topology pcie-switch
DEVICES = {"H100-SXM-80GB": "h100", "H200-SXM-141GB": "h200", "A100-SXM4-80GB": "a100",
           "L40S-48GB": "l40s:pcie-switch", "B200-SXM-180GB": "b200", "B200-180GB": "b200",
           "MI300X-192GB": "mi300x", "RTX-4090-24GB": "rtx4090", "RTX-PRO-6000-96GB": "rtxpro6000",
           # issue 20's fleet: MLPerf's names of these parts (hw_profiles/*.json aliases)
           "GH200-144GB": "gh200", "GH200-96GB": "gh200_96gb", "H100-NVL-94GB": "h100nvl", "H100-PCIe-80GB": "h100pcie",
           "H200-NVL-141GB": "h200nvl", "GB200-186GB": "gb200", "GB300-288GB": "gb300", "B300-SXM-288GB": "b300",
           "MI325X-256GB": "mi325x", "MI355X-288GB": "mi355x"}
ENGINE_NAMES = {"tensorrt-llm": "trtllm", "vllm": "vllm", "sglang": "sglang"}
# what the rows' precision text names -> tracecost weight formats (the first word decides, the note refines)
PRECISIONS = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "fp4": "fp4", "mxfp4": "mxfp4", "int4": "int4",
              "int8": "int8"}
# weight formats of published checkpoint families whose configs tracecost does not bundle: Qwen's FP8 releases
# are fine-grained fp8 with 128x128 blocks (their model cards; quantization_config weight_block_size [128, 128])
CHECKPOINT_FORMATS = ((re.compile(r"^Qwen/Qwen3-.*-FP8$"), "fp8_block"),)
# KV-cache formats a checkpoint declares (used where a row leaves the KV dtype unstated): NVIDIA's ModelOpt
# checkpoints (nvidia/*-FP8, nvidia/*-FP4) carry hf_quant_config.json with kv_cache_quant_algo FP8, and
# TensorRT-LLM's PyTorch backend and vLLM run the KV cache in the format the checkpoint declares
CHECKPOINT_KV = ((re.compile(r"^nvidia/.*-(FP8|FP4|NVFP4)$", re.IGNORECASE), "fp8"),)
METRICS = ("ttft_ms", "tpot_ms", "output_tok_s", "e2e_latency_ms")


@dataclass(frozen=True)
class PublishedRun:
    id: str
    source_kind: str
    model: str
    device: str
    engine: str
    release: str | None          # the engine release the row names (major.minor), None where it names a commit only
    dtype: str
    kv_dtype: str | None
    tp: int
    isl: int
    osl: int
    load: Load                   # of one replica
    memory_fraction: float | None
    measured: dict = field(default_factory=dict)     # ttft_ms, tpot_ms, output_tok_s, e2e_latency_ms
    trtllm_bench: bool = False   # the engine was built by trtllm-bench, which sizes its limits from the dataset
    ep: int = 1
    replicas: int = 1            # DP replicas the load is split over (their throughput adds)
    max_num_seqs: int | None = None          # stated by the run's flags, else the engine's default
    max_batched_tokens: int | None = None
    chunked_prefill: bool | None = None
    mode: str = ""
    percentiles: dict = field(default_factory=dict)  # {"ttft_ms": {"p99": ..}, "tpot_ms": {...}} as measured
    latency_limits: dict = field(default_factory=dict)   # MLPerf's p99 limits, {"ttft_ms": 2000, "tpot_ms": 200}
    lengths: str | None = None   # a bundled length set the run's dataset follows (serving/lengths.py), else fixed
    api_servers: int = 0         # HTTP server processes the requests came through (0: the engine's Python API)
    speculation: Speculation | None = None   # the draft the run used (a chain or a tree)
    prefix_hit_rate: float = 0.0  # the share of each prompt the run states was served from the prefix cache
    streams: bool = False        # its client took each token as it came (MLPerf Server/Interactive, a served benchmark)
    capacity_scheduler: str | None = None   # TensorRT-LLM's KV admission policy, as launched (None: the engine's)
    mixed_chunk: bool = False    # SGLang launched with --enable-mixed-chunk
    set_aside: dict = field(default_factory=dict)    # {metric: why}: numbers the row's own others rule out
    chat_requests: bool = True   # its client sent chat completions (the server renders each prompt; _chat_requests)
    scheduler_steps: int = 1     # vLLM's multi-step scheduling (--num-scheduler-steps): one schedule per k decodes
    attention_dp: bool = False   # the replicas are attention-DP ranks whose MoE layers form one EP group of tp x replicas
    # the KV capacity of one replica its engine logged at start (vLLM's "GPU KV cache size: N tokens"): a run that
    # states it is priced at it, beside tracecost's own estimate from memory (serving/capacity.py)
    kv_cache_tokens: int | None = None


def _engine(text: str) -> str | None:
    text = text.lower()
    return next((name for key, name in ENGINE_NAMES.items() if key in text), None)


def stated_release(engine: str, version: str | None) -> str | None:
    """major.minor of the engine's release as the row states it (ROCm docker tags name vLLM's), or None."""
    text = version or ""
    label = {"vllm": r"vllm\s*v?", "sglang": r"sglang\s*v?", "trtllm": r"tensorrt-llm\s*v?"}[engine]
    m = re.search(label + r"(\d+)\.(\d+)", text, re.IGNORECASE) or re.match(r"\s*v?(\d+)\.(\d+)", text)
    if m:
        return f"{int(m.group(1))}.{int(m.group(2))}"
    commit = re.search(r"@([0-9a-f]{7,})", text)
    if commit:   # a commit names the engine (the libraries beside it may be stale): placed where an entry places it
        return next((b["release"] for b in _engine_builds().get(engine, [])
                     if b.get("commit") and commit.group(1).startswith(b["commit"])), None)
    # a row that names only the libraries it was built with (serving/data/engine_builds.json)
    return next((b["release"] for b in _engine_builds().get(engine, [])
                 if b.get("build") and re.search(re.escape(b["build"]) + r"(?!\d)", text, re.IGNORECASE)), None)


@lru_cache(maxsize=None)
def _engine_builds() -> dict:
    return json.loads((resources.files("serving") / "data" / "engine_builds.json").read_text())


def _dtype(precision: str, model: str | None = None, checkpoint: str | None = None) -> str | None:
    """The weight format tracecost traces a row with: the published checkpoint's own (its bundled config's
    quantization_config, or its family's known format), else the format the precision text names."""
    text = precision.lower()
    first = re.match(r"[a-z0-9]+", text)
    dtype = PRECISIONS.get(first.group(0)) if first else None
    if dtype is None:
        return None
    if ("native" in text or "pre-quantized" in text or "checkpoint" in text) and model in bundled_models() \
            and _declares_quantization(model):
        return "auto"
    known = next((fmt for pattern, fmt in CHECKPOINT_FORMATS if checkpoint and pattern.match(checkpoint)), None)
    if known:
        return known
    if dtype == "fp8" and "block" in text:
        return "fp8_block"
    if dtype == "int8" and ("w8a16" in text or "gptq" in text):
        return "int8_wo"
    return dtype


@lru_cache(maxsize=None)
def _declares_quantization(model: str) -> bool:
    config = resolve_model(model).config
    return bool(config.get("quantization_config") or (config.get("text_config") or {}).get("quantization_config"))


# the datasets whose per-request lengths tracecost bundles (serving/data/length_sets.json); outputs and prompts are
# scaled to the run's own means (the sets hold the dataset's reference outputs, the runs generate their own; a
# run's tokenizer counts the same prompts its own way)
DATASET_LENGTHS = {"MLPerf llama2-70b": "mlperf-llama2-70b", "MLPerf mixtral-8x7b": "mlperf-mixtral-8x7b",
                   "ShareGPT": "sharegpt-vllm-bench"}
_MLPERF_LIMITS = {  # scenario p99 limits (ms) by benchmark, from MLPerf Inference's rules
    ("llama-2-70b", "Server"): {"ttft_ms": 2000.0, "tpot_ms": 200.0},
    ("llama-2-70b", "Interactive"): {"ttft_ms": 450.0, "tpot_ms": 40.0},
    ("mixtral-8x7b", "Server"): {"ttft_ms": 2000.0, "tpot_ms": 200.0},
}


def _checkpoint_kv(checkpoint: str | None) -> str | None:
    return next((kv for pattern, kv in CHECKPOINT_KV if checkpoint and pattern.match(checkpoint)), None)


# engines' names for their drafts -> tracecost's (serving/speculative.py)
SPECULATIVE_METHODS = {"mtp": "mtp", "deepseek_mtp": "mtp", "nextn": "mtp", "eagle3": "eagle3", "ngram": "ngram"}


# SGLang's choice of (speculative_num_steps, speculative_eagle_topk, speculative_num_draft_tokens) when a run
# states none (python/sglang/srt/server_args.py auto_choose_speculative_params, 0.5.x: (5, 4, 8) for every
# architecture but DeepSeek's, whose value changed between releases)
SGLANG_AUTO_TREE = (5, 4, 8)


# how a Speculation's source names an acceptance length taken from the run's stream (stream_acceptance)
STREAMED_ACCEPTANCE = "from the run's stream"


def stream_acceptance(r: dict) -> float | None:
    """The acceptance length a speculative run's own stream shows where the row states none: the mean tokens a step
    gains is its mean ITL over its mean TPOT, since the engine streams each step's accepted tokens as one chunk and
    the client times a gap per chunk (ITL) but divides a request's time by its tokens (TPOT). Only a closed loop of
    users qualifies: in a burst a chunk's gap can also hold a prefill step that the TPOT of other requests shares."""
    itl, tpot = (r.get("itl_ms") or {}).get("mean"), (r.get("tpot_ms") or {}).get("mean")
    if (r.get("spec_decode") or {}).get("acceptance") or not r.get("concurrency") or not itl or not tpot:
        return None
    return itl / tpot


def _speculation(stated: dict, engine: str | None = None,
                 streamed_length: float | None = None) -> tuple[Speculation | None, str | None]:
    """The draft a row's spec_decode states (a chain, or a tree: top-k > 1 with its verified draft tokens), or
    (None, why not). Its acceptance is the one the row states, else the one its stream shows (`streamed_length`,
    which stream_acceptance gives only where the row states none) where that is a length the draft can reach, else
    the method's published default."""
    method = (stated.get("method") or "").lower()
    if method == "eagle" and "mtp" in (stated.get("draft_model") or "").lower():
        method = "mtp"           # SGLang runs DeepSeek's MTP head through its EAGLE worker
    name = SPECULATIVE_METHODS.get(method)
    if method in ("draft_model", "draft"):      # vLLM's name for a separate draft model (--speculative-config)
        draft = MODELS.get(stated.get("draft_model") or "")
        if draft is None:
            return None, f"draft model {stated.get('draft_model')} is not bundled"
        name = f"draft:{draft}"
    if name is None:
        return None, f"speculative method '{stated.get('method')}' is not modelled"
    k = stated.get("num_speculative_tokens") or stated.get("num_steps")
    topk, n = stated.get("eagle_topk") or 1, stated.get("num_draft_tokens")
    if not k and engine == "sglang" and name == "eagle3" and not stated.get("eagle_topk"):
        k, topk, n = SGLANG_AUTO_TREE
    if not k:
        return None, "speculative tokens per step not stated"
    shape = dict(topk=int(topk), draft_tokens=int(n) if topk > 1 and n else None)
    try:
        spec = parse_speculation(name, int(k), acceptance_length=stated.get("acceptance") or None, **shape)
    except ValueError as e:
        return None, str(e)
    if streamed_length is not None:
        try:
            shown = parse_speculation(name, int(k), acceptance_length=streamed_length, **shape)
        except ValueError:    # beyond what the draft can gain: the stream is not one chunk a step
            return spec, None
        spec = replace(shown, source=f"acceptance length {streamed_length:.2f} {STREAMED_ACCEPTANCE}: its mean "
                                     f"ITL over its mean TPOT")
    return spec, None


def _skip_reason(r: dict, model, device, engine) -> str | None:
    if model is None:
        return f"model {r['model']} is not bundled"
    if device is None:
        return f"no profile for {r['gpu']}"
    if engine is None:
        return f"engine {r.get('engine')} has no kernel models"
    if r.get("spec_decode"):
        why = _speculation(r["spec_decode"], engine)[1]
        if why:
            return why
    if (r.get("pp") or 1) != 1 or r.get("disaggregated"):
        return "layout not priced (pipeline or disaggregated)"
    if r.get("attention_dp"):
        layout, why = _attention_dp_layout(r)
        if layout is None:
            return why
    if _dtype(r.get("precision") or "", model, r.get("checkpoint")) is None:
        return f"weight format '{r.get('precision')}' is not modelled"
    if not r.get("isl") or not r.get("osl"):
        return "lengths not stated"
    if (r.get("num_gpus") or 1) > 1 and not r.get("tp") and not r.get("dp"):
        return f"layout not stated ({r['num_gpus']} GPUs, no TP or DP)"
    return None


def _attention_dp_layout(r: dict) -> tuple[tuple[int, int, int] | None, str]:
    """((attention TP, DP ranks, EP), "") of an attention-DP row, or (None, why not). vLLM states its ranks as
    -tp T -dp D (T x D GPUs); SGLang as --tp-size N --dp-size D --enable-dp-attention, each rank's attention then
    running TP N / D. The MoE is one EP group across all of them where the row says so (--ep-size,
    --enable-expert-parallel); tracecost prices no other attention-DP layout."""
    gpus, dp = int(r.get("num_gpus") or 1), int(r.get("dp") or 1)
    flags = stated_settings(r.get("engine_flags"), r.get("engine"))
    ep = int(r.get("ep") or (gpus if flags.expert_parallel else 1))
    if dp < 2 or gpus % dp:
        return None, f"attention DP over {dp} ranks of {gpus} GPUs is not a layout tracecost prices"
    if ep != gpus:
        return None, "attention DP whose MoE is tensor-parallel across the DP ranks (no expert parallelism) is not priced"
    return (gpus // dp, dp, ep), ""


def _measured(r: dict) -> tuple[dict, dict]:
    measured, percentiles = {}, {}
    for metric in ("ttft_ms", "tpot_ms"):
        stats = r.get(metric) or (r.get("itl_ms") if metric == "tpot_ms" else None) or {}
        if stats.get("mean") is not None:
            measured[metric] = stats["mean"]
        percentiles[metric] = {k: v for k, v in stats.items() if k in ("p50", "median", "p90", "p99")}
    if r.get("mode") == "offline_batch":
        if (r.get("e2e_latency_ms") or {}).get("mean") is not None:
            measured["e2e_latency_ms"] = r["e2e_latency_ms"]["mean"]
    elif r.get("output_tok_s") is not None:
        measured["output_tok_s"] = r["output_tok_s"]
    return measured, percentiles


# how far a burst's throughput may exceed the bound its own mean latencies set before the row contradicts itself
SELF_CONSISTENCY_MARGIN = 1.25


def _contradicted(r: dict, measured: dict) -> dict:
    """{metric: why} for numbers a row's other numbers rule out. A burst of N requests of one fixed output length
    (a random dataset) ends no sooner than its mean request, TTFT + (osl - 1) x TPOT, so its output tokens/s is at
    most N x osl over that; a row beyond it (by the margin) reports some other quantity under that name. Varying
    outputs (ShareGPT) have no such bound: short outputs inflate the mean of per-request TPOTs."""
    n, osl = r.get("num_requests"), r.get("osl")
    if r.get("concurrency") or r.get("request_rate") or r.get("mode") == "offline_batch" or not n or not osl \
            or not (r.get("dataset") or "").lower().startswith("random") \
            or not all(m in measured for m in ("ttft_ms", "tpot_ms", "output_tok_s")):
        return {}
    mean_request_s = (measured["ttft_ms"] + (osl - 1) * measured["tpot_ms"]) / 1e3
    if mean_request_s <= 0:
        return {}
    bound = n * osl / mean_request_s
    if measured["output_tok_s"] <= bound * SELF_CONSISTENCY_MARGIN:
        return {}
    return {"output_tok_s": f"{measured['output_tok_s']:.0f} output tokens/s, {measured['output_tok_s'] / bound:.1f}x "
                            f"what its own mean TTFT and TPOT allow a burst of {n} fixed-length requests "
                            f"({bound:.0f})"}


def _prefix_hit_rate(r: dict) -> float:
    """The prefix-cache hit rate a row states: a number, or text that starts with one ("~1.0 (stated: ...)").
    A cache that is on with no stated rate counts as no hits (the dev set's random and ShareGPT prompts)."""
    stated = (r.get("prefix_cache") or {})
    if not stated.get("enabled"):
        return 0.0
    rate = stated.get("hit_rate")
    if isinstance(rate, str):
        m = re.match(r"\s*~?\s*([0-9.]+)", rate)
        rate = float(m.group(1)) if m else None
    return min(1.0, max(0.0, float(rate))) if isinstance(rate, (int, float)) else 0.0


def _chat_requests(r: dict) -> bool:
    """Whether the run's client sent chat completions. A row that names a chat client (`--backend openai-chat`,
    `/v1/chat/completions`) did; one whose launch line runs `vllm bench serve` without one sent completions (its
    default backend, /v1/completions); a row silent on its client is taken as chat, what OpenAI-compatible
    clients send."""
    text = " ".join(str(r.get(k) or "") for k in ("engine_flags", "notes", "dataset"))
    if re.search(r"openai-chat|chat/completions", text):
        return True
    return not re.search(r"\bvllm\s+bench\s+serve\b", r.get("engine_flags") or "")


def _logged_kv_tokens(r: dict) -> int | None:
    """The KV capacity a row states its engine logged, in tokens per replica (None: not stated)."""
    tokens = r.get("kv_cache_tokens")
    if tokens is None:
        return None
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens <= 0:
        raise ValueError(f"{r['id']}: kv_cache_tokens must be a positive whole number of tokens, got {tokens!r}")
    return tokens


def _load(r: dict, replicas: int) -> Load:
    requests = int(r.get("num_requests") or 0)
    if r["mode"] == "offline_batch":
        return Load(MAX, requests=int(r.get("batch_size") or 1))
    if r.get("concurrency"):     # the users cap the load; a stated rate paces their sends (vllm bench serve)
        return Load(CONCURRENCY, float(r["concurrency"]) / replicas, requests=math.ceil(requests / replicas),
                    send_rate=float(r.get("request_rate") or 0.0) / replicas)
    if r.get("request_rate"):
        return Load(RATE, float(r["request_rate"]) / replicas, requests=math.ceil(requests / replicas),
                    spread=replicas)
    return Load(MAX, requests=math.ceil(requests / replicas))


def map_row(r: dict) -> tuple[PublishedRun | None, str | None]:
    """One development-set row as a run tracecost predicts, or (None, why not)."""
    model, engine = MODELS.get(r["model"]), _engine(r.get("engine") or "")
    device = system_device(DEVICES.get(r["gpu"]), r.get("source"))
    if device and r.get("topology") and ":" not in device:    # how the run's GPUs were joined, where its logs say
        device = f"{device}:{r['topology']}"
    why = _skip_reason(r, model, device, engine)
    if why:
        return None, why
    flags = stated_settings(r.get("engine_flags"), r.get("engine"))
    if flags.power_limit_w:
        device = f"{device}@{flags.power_limit_w:g}W"
    tp = int(r.get("tp") or 1)
    replicas = int(r.get("dp") or 1)
    ep = int(r.get("ep") or (tp if flags.expert_parallel else 1))
    if r.get("attention_dp"):
        (tp, replicas, ep), _ = _attention_dp_layout(r)
    measured, percentiles = _measured(r)
    set_aside = _contradicted(r, measured)
    measured = {m: v for m, v in measured.items() if m not in set_aside}
    scenario = r["id"].rsplit("-", 1)[-1]
    dtype = _dtype(r["precision"], model, r.get("checkpoint"))
    if dtype in ("fp16", "bf16"):       # a base precision the harness's code quantizes from
        dtype = harness_weights(r.get("source"), r.get("engine")) or dtype
    kv_dtype = (r.get("kv_cache_dtype") or flags.kv_cache_dtype or system_kv_dtype(r.get("source"), r.get("engine"))
                or _checkpoint_kv(r.get("checkpoint")))
    run = PublishedRun(
        r["id"], r["source_kind"], model, device, engine, stated_release(engine, r.get("engine_version")),
        dtype, kv_dtype, tp,
        max(1, round(r["isl"])), max(1, round(r["osl"])), _load(r, replicas), flags.memory_fraction, measured,
        "trtllm-bench" in (r.get("engine_flags") or "") or "trtllm-bench" in (r.get("engine") or ""), ep, replicas,
        flags.max_num_seqs, flags.max_batched_tokens, flags.chunked_prefill, r.get("mode", ""), percentiles,
        _MLPERF_LIMITS.get((model, scenario), {}) if r["source_kind"].startswith("mlperf") else {},
        next((name for key, name in DATASET_LENGTHS.items() if key.lower() in (r.get("dataset") or "").lower()), None),
        flags.api_servers if flags.api_server else 0,
        _speculation(r["spec_decode"], engine, stream_acceptance(r))[0] if r.get("spec_decode") else None,
        _prefix_hit_rate(r),
        streams=streamed(r["id"], flags.api_server), capacity_scheduler=flags.capacity_scheduler,
        mixed_chunk=flags.mixed_chunk, set_aside=set_aside, chat_requests=_chat_requests(r),
        scheduler_steps=flags.scheduler_steps, attention_dp=bool(r.get("attention_dp")),
        kv_cache_tokens=_logged_kv_tokens(r))
    return run, None


def load_published(*paths: str) -> tuple[list[PublishedRun], list[tuple[str, str]]]:
    """(runs tracecost can predict, [(id, why not)] for the rest), over every file given."""
    runs, skipped = [], []
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            run, why = map_row(row)
            if run is None:
                skipped.append((row["id"], why))
            else:
                runs.append(run)
    return runs, skipped


__all__ = ["DEVICES", "METRICS", "MODELS", "PublishedRun", "STREAMED_ACCEPTANCE", "load_published", "map_row",
           "stream_acceptance"]
