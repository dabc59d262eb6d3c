"""A serving layout written as an engine's launch commands: vLLM, SGLang or TensorRT-LLM.

The text returned is a bash script: YAML files written with here-documents, then one command per instance.
Flag names follow each engine's documentation:
  vLLM    https://docs.vllm.ai/en/latest/serving/engine_args.html (vllm serve),
          https://docs.vllm.ai/en/latest/serving/data_parallel_deployment/ (DP, --enable-expert-parallel),
          https://docs.vllm.ai/en/latest/features/nixl_connector_usage.html (disaggregated prefill, NixlConnector)
  SGLang  https://docs.sglang.io/advanced_features/server_arguments.html (python -m sglang.launch_server),
          https://docs.sglang.io/advanced_features/pd_disaggregation.html (--disaggregation-mode, sglang_router)
  TRT-LLM https://nvidia.github.io/TensorRT-LLM/commands/trtllm-serve.html (trtllm-serve, --extra_llm_api_options),
          https://nvidia.github.io/TensorRT-LLM/features/disagg-serving.html (trtllm-serve disaggregated -c)
Speculative decoding: vLLM's --speculative-config (docs/features/spec_decode: methods mtp, eagle3, draft_model,
ngram), SGLang's --speculative-algorithm EAGLE|EAGLE3|STANDALONE|NGRAM with --speculative-num-steps,
--speculative-eagle-topk and --speculative-num-draft-tokens (server_args.py), TRT-LLM's speculative_config
(decoding_type MTP | Eagle3 | DraftTarget | NGram, max_draft_len, speculative_model).

How tracecost's layout maps: `dp` replicas of `tp` x `pp` GPUs each; `ep` > 1 splits the experts over the `tp`
ranks of a replica (ep == tp) or over every rank of every replica (ep == tp x dp, attention data-parallel).
max_num_seqs and max_batched_tokens are per replica.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from serving.speculative import Speculation

ENGINES = ("vllm", "sglang", "trtllm")
KV_CACHE_DTYPES = ("auto", "fp8")


@dataclass(frozen=True)
class Role:
    """One side of a disaggregated layout: `instances` engine instances of `tp` GPUs each."""
    instances: int
    tp: int = 1
    ep: int = 0                          # 0/1: none; else == tp (experts split over the instance's ranks)
    max_num_seqs: int | None = None      # default: the layout's
    max_batched_tokens: int | None = None


@dataclass(frozen=True)
class Disaggregation:
    prefill: Role
    decode: Role


EAGLE3_HEAD = "EAGLE3_HEAD"     # tracecost prices an EAGLE-3 head of the target's width but does not know its repository


@dataclass(frozen=True)
class ServingLayout:
    model: str                           # the Hugging Face id (or path) the engine loads
    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 0                          # 0/1: no expert parallelism
    max_num_seqs: int = 256
    max_batched_tokens: int = 8192       # tokens per engine step (vLLM's max_num_batched_tokens)
    prefix_caching: bool = False
    memory_utilization: float = 0.9      # share of each GPU's memory the engine may use (vLLM's meaning)
    kv_cache_dtype: str = "auto"         # auto (the model's dtype) or fp8
    moe: bool = False                    # the model has routed experts
    disaggregated: Disaggregation | None = None
    port: int = 8000                     # the first port; instances take the next ones
    trust_remote_code: bool = False
    revision: str | None = None
    # TRT-LLM sizes its KV cache as a share of the memory left after weights: with these, that share is exact
    device_memory_gb: float | None = None
    weights_gb_per_gpu: float | None = None   # weights and activation workspace on one GPU
    # vLLM refuses to start when its KV cache cannot hold one sequence of max_model_len (default: the model's
    # max_position_embeddings); set where the priced KV cache holds fewer tokens than that
    max_model_len: int | None = None
    # the draft searched (serving/speculative.py), its draft_model a Hugging Face id the engine loads
    speculative: Speculation | None = None
    capacity_scheduler: str | None = None     # TensorRT-LLM's KV admission policy (None: its default)

    def __post_init__(self):
        for name in ("tp", "pp", "dp", "max_num_seqs", "max_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.memory_utilization <= 1:
            raise ValueError(f"memory_utilization must be in (0, 1], got {self.memory_utilization}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype}")
        if self.ep > 1 and self.ep not in (self.tp, self.tp * self.dp):
            raise ValueError(f"ep must be 0/1, tp ({self.tp}) or tp x dp ({self.tp * self.dp}), got {self.ep}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if not 1 <= self.port <= 65535 - 64:
            raise ValueError(f"port must be in [1, {65535 - 64}], got {self.port}")
        if self.disaggregated:
            for side in (self.disaggregated.prefill, self.disaggregated.decode):
                if side.instances < 1 or side.tp < 1 or (side.ep > 1 and side.ep != side.tp):
                    raise ValueError(f"disaggregated role {side}: instances and tp must be >= 1, ep 0/1 or tp")

    @property
    def expert_parallel(self) -> bool:
        return self.ep > 1

    @property
    def wide_ep(self) -> bool:
        """Experts over every rank of every replica: engines run this as one instance with attention DP."""
        return self.ep > 1 and self.dp > 1 and self.ep == self.tp * self.dp


@dataclass(frozen=True)
class Instance:
    """One engine process to start: its GPUs, port and sizes."""
    role: str          # "mixed", "prefill" or "decode"
    first_gpu: int
    gpus: int
    port: int
    tp: int
    pp: int
    dp: int            # data-parallel ranks inside this one instance (the engine's own DP)
    ep: int
    max_num_seqs: int
    max_batched_tokens: int

    @property
    def gpu_list(self) -> str:
        return ",".join(str(g) for g in range(self.first_gpu, self.first_gpu + self.gpus))


def _mixed_instances(layout: ServingLayout, engine_dp: bool) -> list[Instance]:
    """Replicas as the engine's own DP when it keeps them independent (`engine_dp`), else one process each."""
    t = layout
    per = t.tp * t.pp
    if t.wide_ep:
        return [Instance("mixed", 0, per * t.dp, t.port, t.tp, t.pp, t.dp, t.ep, t.max_num_seqs, t.max_batched_tokens)]
    if engine_dp or t.dp == 1:
        return [Instance("mixed", 0, per * t.dp, t.port, t.tp, t.pp, t.dp, t.ep, t.max_num_seqs, t.max_batched_tokens)]
    return [Instance("mixed", i * per, per, t.port + 1 + i, t.tp, t.pp, 1, t.ep, t.max_num_seqs, t.max_batched_tokens)
            for i in range(t.dp)]


def _disagg_instances(layout: ServingLayout) -> list[Instance]:
    out, gpu, port = [], 0, layout.port + 1
    for role, side in (("prefill", layout.disaggregated.prefill), ("decode", layout.disaggregated.decode)):
        for _ in range(side.instances):
            out.append(Instance(role, gpu, side.tp, port, side.tp, 1, 1, side.ep, side.max_num_seqs or layout.max_num_seqs,
                                side.max_batched_tokens or layout.max_batched_tokens))
            gpu, port = gpu + side.tp, port + 1
    return out


def _command(words: list[str], env: dict[str, str] | None = None) -> str:
    head = " ".join(f"{k}={v}" for k, v in (env or {}).items())
    return (head + " " if head else "") + " \\\n    ".join(words)


def _heredoc(path: str, data: dict) -> str:
    return f"cat > {path} <<'EOF'\n{_yaml(data)}EOF"


def _yaml(data: dict, indent: int = 0) -> str:
    """Block YAML of nested dicts, lists and scalars: the little TRT-LLM's option files need."""
    pad, out = "  " * indent, ""
    for key, value in data.items():
        if isinstance(value, dict):
            out += f"{pad}{key}:\n{_yaml(value, indent + 1)}"
        elif isinstance(value, list):
            out += f"{pad}{key}:\n" + "".join(f"{pad}  - {json.dumps(v)}\n" for v in value)
        else:
            out += f"{pad}{key}: {json.dumps(value) if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else value}\n"
    return out


def _head_note(layout: ServingLayout) -> list[str]:
    s = layout.speculative
    if s is None or s.method != "eagle3":
        return []
    return [f"# fill in: {EAGLE3_HEAD}, the EAGLE-3 head trained for {layout.model} (a Hugging Face id or path)"]


def _vllm_speculative(s: Speculation) -> dict:
    if s.topk > 1:
        raise ValueError("tree drafts (topk > 1) have no vLLM launch flags in tracecost")
    config = {"mtp": {"method": "mtp"}, "eagle3": {"method": "eagle3", "model": EAGLE3_HEAD},
              "draft": {"method": "draft_model", "model": s.draft_model}, "ngram": {"method": "ngram",
                                                                                 "prompt_lookup_max": 4}}[s.method]
    return {**config, "num_speculative_tokens": s.k}


def _sglang_speculative(s: Speculation) -> list[str]:
    algorithm = {"mtp": "EAGLE", "eagle3": "EAGLE3", "draft": "STANDALONE", "ngram": "NGRAM"}[s.method]
    words = [f"--speculative-algorithm {algorithm}"]
    if s.method == "eagle3":
        words.append(f"--speculative-draft-model-path {EAGLE3_HEAD}")
    elif s.method == "draft":
        words.append(f"--speculative-draft-model-path {shlex.quote(s.draft_model or '')}")
    if s.method != "ngram":
        words += [f"--speculative-num-steps {s.k}", f"--speculative-eagle-topk {s.topk}"]
    return words + [f"--speculative-num-draft-tokens {s.verify_tokens}"]


def _trtllm_speculative(s: Speculation) -> dict:
    if s.topk > 1:
        raise ValueError("tree drafts (topk > 1) have no TensorRT-LLM launch options in tracecost")
    return {"mtp": {"decoding_type": "MTP", "num_nextn_predict_layers": s.k},
            "eagle3": {"decoding_type": "Eagle3", "max_draft_len": s.k, "speculative_model": EAGLE3_HEAD},
            "draft": {"decoding_type": "DraftTarget", "max_draft_len": s.k, "speculative_model": s.draft_model},
            "ngram": {"decoding_type": "NGram", "max_draft_len": s.k}}[s.method]


def _common_model_words(layout: ServingLayout, style: str) -> list[str]:
    sep = "_" if style == "trtllm" else "-"
    words = []
    if layout.revision and style != "trtllm":
        words.append(f"--revision {shlex.quote(layout.revision)}")
    if layout.trust_remote_code:
        words.append(f"--trust{sep}remote{sep}code")
    return words


# ---- vLLM -------------------------------------------------------------------------------------------------------

def _vllm(layout: ServingLayout) -> list[str]:
    # vLLM's --data-parallel-size couples the replicas of an MoE model (its expert layers form one TP/EP group over
    # DP x TP), which is not what tracecost priced unless ep == tp x dp: such replicas run as separate processes
    engine_dp = not layout.moe
    instances = _disagg_instances(layout) if layout.disaggregated else _mixed_instances(layout, engine_dp)
    lines = _head_note(layout)
    for k, inst in enumerate(instances):
        words = [f"vllm serve {shlex.quote(layout.model)}", f"--port {inst.port if len(instances) > 1 else layout.port}",
                 f"--tensor-parallel-size {inst.tp}"]
        if inst.pp > 1:
            words.append(f"--pipeline-parallel-size {inst.pp}")
        if inst.dp > 1:
            words.append(f"--data-parallel-size {inst.dp}")
        if inst.ep > 1:
            words.append("--enable-expert-parallel")
        words += [f"--max-num-seqs {inst.max_num_seqs}", f"--max-num-batched-tokens {inst.max_batched_tokens}",
                  "--enable-prefix-caching" if layout.prefix_caching else "--no-enable-prefix-caching",
                  f"--gpu-memory-utilization {layout.memory_utilization:g}", f"--kv-cache-dtype {layout.kv_cache_dtype}"]
        if layout.max_model_len:
            words.append(f"--max-model-len {layout.max_model_len}")
        if layout.speculative:
            words.append("--speculative-config " + shlex.quote(json.dumps(_vllm_speculative(layout.speculative))))
        words += _common_model_words(layout, "vllm")
        env = {"CUDA_VISIBLE_DEVICES": inst.gpu_list} if len(instances) > 1 else {}
        if layout.disaggregated:
            words.append("--kv-transfer-config " + shlex.quote(json.dumps({"kv_connector": "NixlConnector",
                                                                           "kv_role": "kv_both"})))
            env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(5600 + k)
        lines.append(f"# {inst.role} instance on GPUs {inst.gpu_list}")
        lines.append(_command(words, env) + (" &" if len(instances) > 1 else ""))
    if layout.disaggregated:
        lines.append(f"# fill in: a proxy on port {layout.port} that sends each request to a prefill instance, then to "
                     f"a decode instance (vLLM's examples/online_serving/disaggregated_serving has a toy one); "
                     f"each instance's host when they span machines; UCX_NET_DEVICES for NIXL's transport")
    elif len(instances) > 1:
        lines.append(f"# fill in: a load balancer on port {layout.port} over ports "
                     f"{instances[0].port}-{instances[-1].port} (and each instance's host when they span machines)")
    return lines


# ---- SGLang -----------------------------------------------------------------------------------------------------

SGLANG_KV_DTYPES = {"auto": "auto", "fp8": "fp8_e4m3"}


def _sglang(layout: ServingLayout) -> list[str]:
    # SGLang's --dp-size without DP attention runs independent replicas, so it serves every mixed layout in one
    # process; ep == tp x dp is its DP-attention mode, where --tp-size counts every GPU
    instances = _disagg_instances(layout) if layout.disaggregated else _mixed_instances(layout, engine_dp=True)
    lines = _head_note(layout)
    for inst in instances:
        tp = inst.tp * inst.dp if layout.wide_ep and not layout.disaggregated else inst.tp
        words = [f"python -m sglang.launch_server --model-path {shlex.quote(layout.model)}",
                 f"--port {inst.port if len(instances) > 1 else layout.port}", f"--tp-size {tp}"]
        if inst.first_gpu:
            words.append(f"--base-gpu-id {inst.first_gpu}")
        if inst.pp > 1:
            words.append(f"--pp-size {inst.pp}")
        if inst.dp > 1:
            words.append(f"--dp-size {inst.dp}")
        if layout.wide_ep and not layout.disaggregated:
            words.append("--enable-dp-attention")
        if inst.ep > 1:
            words.append(f"--ep-size {inst.ep}")
        # the prefill token budget: a prompt is cut into chunks of this many tokens, and a prefill batch holds no more
        words += [f"--max-running-requests {inst.max_num_seqs}", f"--chunked-prefill-size {inst.max_batched_tokens}",
                  f"--max-prefill-tokens {inst.max_batched_tokens}",
                  f"--mem-fraction-static {layout.memory_utilization:g}",
                  f"--kv-cache-dtype {SGLANG_KV_DTYPES[layout.kv_cache_dtype]}"]
        if not layout.prefix_caching:
            words.append("--disable-radix-cache")   # SGLang's prefix cache (radix tree) is on by default
        if layout.speculative:
            words += _sglang_speculative(layout.speculative)
        words += _common_model_words(layout, "sglang")
        if layout.disaggregated:
            words += [f"--disaggregation-mode {inst.role}", "--disaggregation-transfer-backend mooncake"]
        lines.append(f"# {inst.role} instance on GPUs {inst.gpu_list}")
        lines.append(_command(words) + (" &" if len(instances) > 1 else ""))
    if layout.disaggregated:
        router = ["python -m sglang_router.launch_router", "--pd-disaggregation"]
        router += [f"--{i.role} http://127.0.0.1:{i.port}" for i in instances]
        router += ["--host 0.0.0.0", f"--port {layout.port}"]
        lines.append("# fill in: each instance's host in place of 127.0.0.1, and --disaggregation-ib-device "
                     "(the RDMA device Mooncake uses) on every instance")
        lines.append(_command(router))
    if layout.wide_ep and not layout.disaggregated:
        lines.append("# note: with DP attention, check how your SGLang version applies --max-running-requests over "
                     "the DP ranks; tracecost's figure is per rank")
    return lines


# ---- TensorRT-LLM -----------------------------------------------------------------------------------------------

def _trtllm_free_fraction(layout: ServingLayout) -> tuple[float, str | None]:
    """TRT-LLM's free_gpu_memory_fraction: the share of memory left after weights that goes to the KV cache."""
    u = layout.memory_utilization
    if layout.device_memory_gb and layout.weights_gb_per_gpu is not None:
        m, w = layout.device_memory_gb, layout.weights_gb_per_gpu
        if w >= m * u:
            raise ValueError(f"weights ({w:g} GB) leave no KV cache room in {u:g} x {m:g} GB")
        return round((m * u - w) / (m - w), 3), None
    return u, (f"# note: TRT-LLM's free_gpu_memory_fraction is a share of the memory left after the weights, not of "
               f"the whole GPU; {u:g} is used as given (pass device memory and weights for the exact share)")


def _trtllm(layout: ServingLayout) -> list[str]:
    # trtllm-serve has no data-parallel flag: replicas are separate processes, except ep == tp x dp, which is one
    # instance with attention data parallelism (enable_attention_dp)
    instances = _disagg_instances(layout) if layout.disaggregated else _mixed_instances(layout, engine_dp=False)
    fraction, note = _trtllm_free_fraction(layout)
    lines = ([note] if note else []) + _head_note(layout)
    kv_cache = {"enable_block_reuse": layout.prefix_caching}
    if layout.kv_cache_dtype == "fp8":
        kv_cache["dtype"] = "fp8"
    options = {"kv_cache_config": kv_cache}
    if layout.wide_ep and not layout.disaggregated:
        options["enable_attention_dp"] = True
    if layout.speculative:
        options["speculative_config"] = _trtllm_speculative(layout.speculative)
    if layout.capacity_scheduler:     # the LLM API's SchedulerConfig (tensorrt_llm/llmapi/llm_args.py)
        options["scheduler_config"] = {"capacity_scheduler_policy": layout.capacity_scheduler.upper()}
    files = {"mixed": "tracecost-trtllm.yaml", "prefill": "tracecost-trtllm-ctx.yaml",
             "decode": "tracecost-trtllm-gen.yaml"}
    if layout.disaggregated:
        transfer = {"backend": "DEFAULT"}
        lines.append(_heredoc(files["prefill"], dict(options, disable_overlap_scheduler=True,
                                                     cache_transceiver_config=transfer)))
        lines.append(_heredoc(files["decode"], dict(options, cache_transceiver_config=transfer)))
    else:
        lines.append(_heredoc(files["mixed"], options))
    for inst in instances:
        tp = inst.tp * inst.dp if layout.wide_ep and not layout.disaggregated else inst.tp
        words = [f"trtllm-serve {shlex.quote(layout.model)}", "--host 0.0.0.0",
                 f"--port {inst.port if len(instances) > 1 or layout.disaggregated else layout.port}",
                 "--backend pytorch", f"--tp_size {tp}", f"--pp_size {inst.pp}"]
        if inst.ep > 1:
            words.append(f"--ep_size {inst.ep}")
        words += [f"--max_batch_size {inst.max_num_seqs}", f"--max_num_tokens {inst.max_batched_tokens}",
                  f"--kv_cache_free_gpu_memory_fraction {fraction:g}"]
        words += _common_model_words(layout, "trtllm")
        words.append(f"--extra_llm_api_options {files[inst.role]}")
        env = {"CUDA_VISIBLE_DEVICES": inst.gpu_list} if len(instances) > 1 else {}
        lines.append(f"# {inst.role} instance on GPUs {inst.gpu_list}")
        lines.append(_command(words, env) + (" &" if len(instances) > 1 else ""))
    if layout.disaggregated:
        servers = {role: [f"127.0.0.1:{i.port}" for i in instances if i.role == role] for role in ("prefill", "decode")}
        lines.append("# fill in: each instance's host in place of 127.0.0.1 (the KV transfer backend is TRT-LLM's "
                     "default; set cache_transceiver_config.backend to UCX or NIXL to choose)")
        lines.append(_heredoc("tracecost-trtllm-disagg.yaml", {
            "hostname": "0.0.0.0", "port": layout.port, "backend": "pytorch",
            "context_servers": {"num_instances": len(servers["prefill"]), "urls": servers["prefill"]},
            "generation_servers": {"num_instances": len(servers["decode"]), "urls": servers["decode"]}}))
        lines.append("trtllm-serve disaggregated -c tracecost-trtllm-disagg.yaml")
    elif len(instances) > 1:
        lines.append(f"# fill in: a load balancer on port {layout.port} over ports "
                     f"{instances[0].port}-{instances[-1].port} (and each instance's host when they span machines)")
    return lines


LAUNCHERS = {"vllm": _vllm, "sglang": _sglang, "trtllm": _trtllm}


def launch_command(layout: ServingLayout, engine: str) -> str:
    """The layout as a bash script that starts `engine` (vllm, sglang or trtllm) with it."""
    if engine not in LAUNCHERS:
        raise ValueError(f"unknown engine '{engine}' (choose from {', '.join(LAUNCHERS)})")
    gpus = (layout.tp * layout.pp * layout.dp if not layout.disaggregated else
            sum(s.instances * s.tp for s in (layout.disaggregated.prefill, layout.disaggregated.decode)))
    head = f"# {layout.model} on {gpus} GPU(s) with {engine}: generated by tracecost"
    return "\n".join([head, *LAUNCHERS[engine](layout)]) + "\n"
