"""Serving engines as tracecost prices them: one entry per engine, the behaviour its kernel models assume.

The kernel times themselves are fitted per device and engine (`hw_profiles/*.json`, section `engines`);
what lives here is how each engine composes kernels into a step and a server: its all-reduce choice, its
scheduler's default limits, its memory budget, its CUDA-graph coverage, and (fitted on published end-to-end
runs, `cost/engine_serving.json`) the time a step and a request cost beyond the kernels.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from .engine_kernels.common import release_key
from .engine_kernels.params import ParamSet, param


@dataclass(frozen=True)
class ServingDefaults:
    """What the engine does unless told otherwise."""
    max_num_seqs: int            # requests running at once
    max_batched_tokens: int      # tokens per step (chunked prefill budget, decode tokens included)
    memory_fraction: float       # of total memory (weights + KV + reserve), or of what the weights leave free
    memory_of_free: bool
    graph_max_batch: int         # decode batches up to this run as CUDA graphs, larger ones launch eagerly
    chunked_prefill: bool        # long prompts are split over steps within max_batched_tokens
    cache_block_tokens: int = 1  # prefix-cache hits count in whole KV blocks of this many tokens
    activations_in_budget: bool = True   # the step's activations come out of memory_fraction (else beyond it)
    # a step with prompts to prefill runs them alone and the decoding requests wait through it (SGLang's scheduler:
    # a new prefill batch goes first, decodes run in the steps between; `--enable-mixed-chunk` mixes them); False:
    # every step carries the decodes and fills the rest of its budget with prefill (vLLM, TensorRT-LLM)
    prefill_apart: bool = False


# a query of at most this many rows per sequence is a decode or a speculative verification (1 + the draft tokens),
# which every engine runs on its absorbed MLA kernel (vLLM's decode path takes queries up to reorder_batch_threshold,
# 1 + num_speculative_tokens; SGLang's target_verify runs MLA)
MLA_DECODE_QUERY_ROWS = 16


@dataclass(frozen=True)
class MlaPrefill:
    """How an engine runs MLA attention over a prompt chunk. Engines prefill in the expanded multi-head form:
    K-nope and V per head up-projected from the latent cache by kv_b_proj, then FlashAttention at the expanded head
    dims (192 / 128 for DeepSeek-V3): 3.4x fewer attention FLOPs than the absorbed form's 576 / 512 over one latent
    head, plus the up-projection of the cached context. `absorbed_prefix`: the range of cached-prefix tokens (summed
    over the batch's sequences) at which the engine keeps its absorbed kernel for a chunk; (0, -1): never."""
    source: str
    absorbed_prefix: tuple[int, int] = (0, -1)

    def expanded(self, query_rows: int, prefix_tokens: int) -> bool:
        low, high = self.absorbed_prefix
        return query_rows > MLA_DECODE_QUERY_ROWS and not low <= prefix_tokens <= high


@dataclass(frozen=True)
class AsyncScheduling:
    """A scheduler that prepares step N + 1 on the host while the GPU runs step N (vLLM's async scheduling): the
    host work of a step (ServingOverheads.step_us, seq_us and stream_us) runs under the GPU's step and costs only
    what exceeds it. The overheads of the releases before `since` were fitted with that work in series.
    `since`: the first release that schedules so by default; `off_for`: the speculative methods (tracecost's names)
    with which it does not; pipeline parallelism turns it off too."""
    since: str
    off_for: tuple[str, ...]
    source: str

    def runs(self, release: str, pp: int = 1, method: str | None = None) -> bool:
        return release_key(release) >= release_key(self.since) and pp == 1 and method not in self.off_for


@dataclass(frozen=True)
class Engine:
    name: str
    label: str
    # the engine's own all-reduce serves messages up to this size over NVLink, NCCL the rest
    custom_allreduce_max_bytes: int
    # GPU counts the custom all-reduce supports; on PCIe-only machines it serves at most two GPUs
    custom_allreduce_gpus: tuple[int, ...] = (2, 4, 6, 8)
    pcie_custom_allreduce_max_gpus: int = 2
    # GEMM formats whose activation quantization the engine fuses into the kernel before the GEMM (the norm,
    # the activation, attention's output) instead of running a quantization kernel per GEMM
    fused_activation_quant: tuple[str, ...] = ()
    # the GPU vendors the engine builds for (its installation docs); a device of another vendor is refused
    vendors: tuple[str, ...] = ("NVIDIA", "AMD")
    # query heads per KV head (lowest, highest) that the engine's grouped-query decode kernel serves; a decode of
    # any other group runs its multi-head kernel, a CTA per query head, with kernel models of its own (the
    # `<kv>_mha` decode sets). None: one decode kernel for every group
    gqa_decode_groups: tuple[int, int] | None = None
    # model types whose chat requests the engine's HTTP server renders without the model's Jinja chat template
    # (ServingOverheads.chat_template_ms)
    own_chat_renderers: tuple[str, ...] = ()
    # a one-token query runs the decode kernel, whether it is a new request's whole prompt or a decode step
    # (the engine splits its batch by query length); False: a new request's forward is a prefill (extend, context)
    # call whatever its length
    one_token_query_decodes: bool = False
    # how it prefills MLA (DeepSeek): None, absorbed as it decodes
    mla_prefill: MlaPrefill | None = None
    # chunked local attention (Llama-4) runs by chunks, each query over its own chunk's keys; False: the engine's
    # kernels run such a layer as full causal attention, or tracecost does not know that they do not
    runs_attention_chunks: bool = False
    # the scheduler overlaps its host work with the GPU's step from this release on; None: never by default
    async_scheduling: AsyncScheduling | None = None

    def decode_kernel(self, group: float, kv_shares_storage: bool = False) -> str:
        """'mha' where the engine runs a query-head group's decode on its multi-head kernel, else ''. MLA's absorbed
        decode (one latent for every head) runs a kernel of its own built for that group."""
        if self.gqa_decode_groups is None or kv_shares_storage:
            return ""
        low, high = self.gqa_decode_groups
        return "" if low <= group <= high else "mha"

    def serving_defaults(self, memory_gb: float, device_name: str) -> ServingDefaults:
        big = memory_gb >= 70 and "a100" not in device_name.lower()
        if self.name == "vllm":
            # vllm/engine/arg_utils.py get_batch_defaults (API server): 8192 tokens / 1024 seqs on >= 70 GiB
            # GPUs other than A100, else 2048 / 256; gpu_memory_utilization 0.9; graphs up to 512;
            # KV blocks of 16 tokens (vllm/config/cache.py block_size)
            return ServingDefaults(1024 if big else 256, 8192 if big else 2048, 0.9, False, 512, True,
                                   cache_block_tokens=16)
        if self.name == "sglang":
            # sglang/srt/server_args.py: chunked_prefill_size 8192 on large GPUs (else 2048),
            # mem_fraction_static about 0.88, cuda_graph_max_bs 256 on large GPUs (else 160); the radix cache
            # matches single tokens (page_size 1). mem_fraction_static is the share for weights and the KV pool
            # ("static allocation"): activations and CUDA graphs live in the rest. Its scheduler runs a new
            # prefill batch before the running decodes (scheduler.py get_next_batch_to_run; enable_mixed_chunk
            # off by default)
            return ServingDefaults(2048, 8192 if big else 2048, 0.88, False, 256 if big else 160, True,
                                   cache_block_tokens=1, activations_in_budget=False, prefill_apart=True)
        # TensorRT-LLM (trtllm-serve / trtllm-bench): max_batch_size 2048, max_num_tokens 8192,
        # KV cache takes free_gpu_memory_fraction 0.9 of what the engine leaves free; no chunked context;
        # KV blocks of 32 tokens (tensorrt_llm KvCacheConfig tokens_per_block)
        return ServingDefaults(2048, 8192, 0.9, True, 2048, False, cache_block_tokens=32)


# Where each engine runs: vLLM builds for CUDA and ROCm (vllm docs/getting_started/installation/gpu: "NVIDIA CUDA",
# "AMD ROCm"); SGLang likewise (sglang docs/platforms/amd_gpu.md); TensorRT-LLM is CUDA only (NVIDIA/TensorRT-LLM
# docs/source/installation: NVIDIA GPUs). Ascend NPUs run vLLM through the vllm-project/vllm-ascend plugin or
# Huawei's MindIE, neither of which tracecost has kernel models for.
# vLLM: vllm/distributed/device_communicators/custom_all_reduce.py (max_size 8 MiB; world sizes 2, 4, 6, 8;
# disabled on more than two PCIe-only GPUs). SGLang ships the same kernel (sgl-kernel custom_all_reduce).
# TensorRT-LLM: its AllReduce plugin's one-/two-shot kernels serve up to the same order of message size.
ENGINES: dict[str, Engine] = {
    # vLLM renders gpt-oss chats with openai_harmony, not a Jinja template (vllm/entrypoints/openai/serving_chat.py:
    # use_harmony where the model type is gpt_oss)
    # vLLM V1 runs every one-token query as a decode: FlashInfer's backend splits the batch at query length 1
    # (vllm/v1/attention/backends/utils.py split_decodes_and_prefills, decode threshold 1) and FlashAttention's
    # varlen call over the paged cache takes its split-KV decode kernel at one query row. The kernel tables agree:
    # vLLM's context-attention rows of one-token prompts are timed on FlashInfer's decode kernel
    # (kernel_source vllm_flashinfer_fidecode / vllm_flashinfer_trtllmdecode), on the same FlashAttention call as
    # its decode rows elsewhere. SGLang (an extend batch) and TensorRT-LLM (a context request) prefill them.
    # vLLM wraps whichever backend it runs in virtual batches, one per chunk a sequence spans
    # (vllm/attention/layers/chunked_local_attention.py, make_local_attention_virtual_batches)
    "vllm": Engine("vllm", "vLLM", custom_allreduce_max_bytes=8 * 2**20, own_chat_renderers=("gpt_oss",),
                   one_token_query_decodes=True, runs_attention_chunks=True,
                   mla_prefill=MlaPrefill("vllm/v1/attention/backends/mla/common.py: prefills run flash_attn_varlen "
                                          "over K and V up-projected by kv_b_proj (the cached context chunk by chunk, "
                                          "_compute_prefill_context); decodes the absorbed kernel (FlashMLA)"),
                   async_scheduling=AsyncScheduling(
                       "0.14", ("draft", "ngram"),
                       "vLLM 0.14.0 release notes: 'Async scheduling is now enabled by default' (pull request #27614; "
                       "with EAGLE and MTP drafts too, #31998), excluding pipeline parallelism and the other "
                       "speculative methods; the vLLM PR #24322 serve logs (tomasruizt/vllm-scripts @d94d714) print "
                       "'Asynchronous scheduling is enabled.' without speculation and with EAGLE-3, and 'Async "
                       "scheduling not supported with draft_model-based speculative decoding and will be disabled.'")),
    "sglang": Engine("sglang", "SGLang", custom_allreduce_max_bytes=8 * 2**20,
                     mla_prefill=MlaPrefill("sglang/srt/models/deepseek_common/attention_backend_handler.py "
                                            "_handle_attention_backend (0.5.14): an extend without speculation whose "
                                            "prefix is 0 or at least SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD (8192) "
                                            "runs MHA, a prefix of 1-8191 the absorbed MLA kernel",
                                            absorbed_prefix=(1, 8191))),
    # TensorRT-LLM's FP8 checkpoints (ModelOpt) carry static activation scales: RMSNorm, SwiGLU and the attention
    # kernels write FP8 directly; NVFP4's block scales are computed by the same kernels (its fused add + RMSNorm +
    # NVFP4 quantization, and the all-reduce fusion RESIDUAL_RMS_NORM_QUANT_NVFP4), so no GEMM quantizes its input
    # Its XQA decode kernel serves MQA and GQA (docs/source/blogs/XQA-kernel.md: "XQA kernel provides optimization
    # for MQA and GQA during generation phase") and packs at most 32 query heads per KV head; one head per KV head
    # (MHA) or more than 32 run the masked multi-head attention kernel. Every TensorRT-LLM table (A100 to GB300)
    # shows the two: at one key, a CTA wave takes 1.3-1.5 us for groups of 1 and past 32, 4-7 us for bf16 GQA
    # (H100), and one kernel model per KV format cannot fit both
    "trtllm": Engine("trtllm", "TensorRT-LLM", custom_allreduce_max_bytes=8 * 2**20,
                     fused_activation_quant=("fp8", "nvfp4"), vendors=("NVIDIA",), gqa_decode_groups=(2, 32),
                     mla_prefill=MlaPrefill("AIConfigurator 0.12's TensorRT-LLM 1.3.0rc20 context-MLA table on H200: "
                                            "128 heads over 32,768 tokens in 77.0 ms, 571 TFLOP/s in the expanded "
                                            "form and 1,942 (twice the bf16 peak) in the absorbed one")),
}
DEFAULT_ENGINE = "vllm"
# serving engines of vendors that none of ENGINES runs on, named when such a device is refused
OTHER_VENDOR_ENGINES = {"Huawei": "vLLM-Ascend (vllm-project/vllm-ascend) and MindIE"}


def engine_refusal(engine: str, vendor: str, device: str) -> str | None:
    """Why `engine` cannot serve on a `vendor` device (one line), or None where it runs (or the vendor is unknown)."""
    spec = ENGINES[engine]
    if not vendor or vendor in spec.vendors:
        return None
    here = [e.label for e in ENGINES.values() if vendor in e.vendors]
    there = OTHER_VENDOR_ENGINES.get(vendor)
    if here:
        instead = f"engines tracecost prices on {vendor}: {', '.join(here)}"
    elif there:
        instead = (f"{vendor} devices serve with {there}, which tracecost has no kernel models for "
                   f"(--execution eager prices HF transformers there)")
    else:
        instead = f"tracecost has no engine for {vendor} devices (--execution eager prices HF transformers)"
    return f"{spec.label} runs on {' and '.join(spec.vendors)} GPUs only, not on {device}; {instead}"


def engines_on(vendor: str) -> list[str]:
    """The engines that run on a vendor's devices."""
    return [name for name in ENGINES if engine_refusal(name, vendor, "") is None]


@dataclass(frozen=True)
class ServingOverheads(ParamSet):
    """Time a serving engine spends beyond its kernels, fitted on published end-to-end runs."""
    step_us: float = param(300.0, 0.0, 20000.0, "scheduler and host work per step, us")
    seq_us: float = param(2.0, 0.0, 200.0, "per running request per step (batch bookkeeping, sampling), us")
    # rank sync: the scheduler's output broadcast to every rank and a barrier, tens to hundreds of us a step;
    # the bound leaves room for slow host links, not for work the kernels model
    gpu_sync_us: float = param(200.0, 0.0, 2000.0, "per step and per extra GPU of a TP/PP group (rank sync), us")
    request_ms: float = param(10.0, 0.0, 500.0, "per request outside the steps: API, tokenization, first token, ms")
    # The HTTP server takes requests in one at a time (parsing, tokenization, the engine's input checks) in one
    # Python process: a burst enters the engine at this pace, and no stream of more than 1000 / frontend_ms
    # requests/s per server process is served. Only requests that come through the server pay it.
    frontend_ms: float = param(0.0, 0.0, 50.0, "serial per-request work of the HTTP server's process, ms")
    # A chat request's prompt is rendered from the model's Jinja chat template in that same process. vLLM parses
    # the template on every request (its content-format detection and the template's variables,
    # vllm/entrypoints/chat_utils.py; vLLM PR #19735 measures 3x the requests/s of Qwen3-0.6B with the detection
    # skipped); a model the engine renders with a renderer of its own skips it (Engine.own_chat_renderers)
    chat_template_ms: float = param(0.0, 0.0, 50.0, "per chat request rendered from a Jinja chat template, ms")
    # A client that streams (MLPerf Server/Interactive's token latencies, an HTTP client's stream=true) gets a
    # response for every running request after every step: the engine builds it and hands it to its caller
    # inside the step loop. Steps of the same batch cost more in MLPerf Server than in Offline; this is that.
    stream_us: float = param(0.0, 0.0, 200.0, "per running request per step when its tokens are streamed, us")
    # not fitted (serving/calibrate_overheads.py FITTED_TERMS): it is how the engine divides memory, which end-to-end
    # times hardly constrain; set per engine from its memory accounting (cost/engine_serving.json, reserve_source)
    reserve_gb: float = param(2.0, 0.0, 40.0, "memory inside the engine's budget besides weights, activations and KV, GB")
    # not fitted either: the buffers of the communicators (NCCL, the engine's custom all-reduce) a replica of more
    # than one GPU creates on each of them, inside the budget the engine measures
    group_reserve_gb: float = param(0.0, 0.0, 40.0, "per GPU of a replica of more than one GPU: its communicators, GB")
    # The kernel fits time one release's kernels (the AIConfigurator tables'); an older release built its engines
    # with older kernels (TensorRT-LLM 0.9 with TensorRT 9.3: NVIDIA states up to 27% more H200 performance from
    # software alone between MLPerf v4.0 and v4.1). 1 for the shared physics by definition; a release takes its
    # own value only where its rows demand one (serving/calibrate_overheads.py RELEASE_TERMS)
    kernel_time: float = param(1.0, 0.5, 2.0, "this release's step kernels over the time the kernel fits give")


@lru_cache(maxsize=1)
def _overheads_data() -> dict:
    return json.loads((resources.files("cost") / "engine_serving.json").read_text())


def parse_engine(text: str) -> tuple[str, str | None]:
    """`vllm`, `trtllm==0.17`: the engine and the release asked for (None: the newest with data)."""
    name, _, release = text.strip().partition("==")
    name = name.strip().lower()
    if name not in ENGINES:
        raise ValueError(f"unknown engine '{name}' (choose from {', '.join(ENGINES)}; a release as trtllm==0.17)")
    release = release.strip()
    if _ and not re.fullmatch(r"\d+(\.\d+)*([a-z0-9.]*)", release):
        raise ValueError(f"engine release '{release}' is not a version (as in trtllm==0.17)")
    return name, (release or None)


def engine_releases(engine: str) -> list[str]:
    """The releases of `engine` with fitted end-to-end overheads, oldest first."""
    entry = _overheads_data().get(engine) or {}
    return sorted(entry.get("releases", {}), key=release_key)


def scheduled_ahead(engine: str, release: str | None, pp: int = 1, method: str | None = None) -> bool:
    """The engine, at `release` (None: the newest with data), schedules each step while the GPU runs the one before
    (AsyncScheduling), for a replica of `pp` stages speculating with `method` (None: not)."""
    rule = ENGINES[engine].async_scheduling
    release = release or next(reversed(engine_releases(engine)), None)
    return bool(rule and release and rule.runs(release, pp, method))


def nearest_release(engine: str, release: str | None) -> str | None:
    """The release with fitted overheads nearest `release`: its own, else the newest older one, else the oldest
    (None: no release asked, the newest). A release with kernel tables and no end-to-end rows (TensorRT-LLM 1.0)
    runs its own kernels at this one's overheads."""
    known = engine_releases(engine)
    if release is None or not known or release in known:
        return release if release in known else None
    older = [k for k in known if release_key(k) <= release_key(release)]
    return older[-1] if older else known[0]


@dataclass(frozen=True)
class ResolvedOverheads:
    params: ServingOverheads
    release: str | None          # the release whose overheads these are (None: the engine has none of its own)
    origin: str                  # what they were fitted on, said in every command's notes


def resolve_overheads(engine: str, release: str | None = None, asked: str | None = None) -> ResolvedOverheads:
    """The engine's overheads at `release` (default: the newest release with data). The fit shares physics
    across releases (`shared`) and adds a release's own terms only where its rows demanded them. An engine with
    no end-to-end rows borrows another's (`from`), and says so."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine '{engine}' (choose from {', '.join(ENGINES)})")
    entry = _overheads_data().get(engine) or {}
    if "from" in entry:
        base = resolve_overheads(entry["from"])
        asked = f" {release}" if release else ""
        return ResolvedOverheads(base.params, None, f"no {ENGINES[engine].label}{asked} end-to-end data: "
                                 f"{ENGINES[entry['from']].label} {base.release}'s ({base.origin})")
    releases = engine_releases(engine)
    shared = (entry.get("shared") or entry).get("params", {})      # a fit with no releases: its params alone
    if not releases:
        return ResolvedOverheads(ServingOverheads.from_json(shared, f"engine_serving.json:{engine}"), None,
                                 entry.get("origin", "defaults (not fitted)"))
    if release is None:
        release = releases[-1]
        how = "newest with data"
    elif release in releases:
        # `asked`: the release a run asked for, which has kernel tables and no end-to-end rows of its own
        how = f"no {ENGINES[engine].label} {asked} end-to-end data: the nearest release's" \
            if asked and asked != release else "as asked"
    else:
        raise ValueError(f"no {ENGINES[engine].label} {release} end-to-end data (releases with data: "
                         f"{', '.join(releases)})")
    own = entry["releases"][release]
    params = ServingOverheads.from_json({**shared, **own.get("params", {})}, f"engine_serving.json:{engine}.{release}")
    terms = ", ".join(sorted(own.get("params", {}))) or "none"
    return ResolvedOverheads(params, release, f"{ENGINES[engine].label} {release} ({how}; its own terms: {terms}); "
                             f"{entry.get('origin', 'fitted')}")


def serving_overheads(engine: str, release: str | None = None, asked: str | None = None) \
        -> tuple[ServingOverheads, str]:
    """The engine's fitted overheads and where they come from (another engine's fit, when it has none)."""
    r = resolve_overheads(engine, release, asked)
    return r.params, r.origin
