"""Which fused-MoE runner an engine's default launch runs a model's experts on (data: moe_runners.json).

SGLang picks its MoE runner per model architecture and device: on SM100 (B200, B300, GB200, GB300) the Qwen3-MoE and
DeepSeek-V3 families run FlashInfer's TensorRT-LLM MoE kernels, other architectures its Triton fused-MoE kernel;
Nemotron-H runs FlashInfer's CUTLASS MoE off SM100 (python/sglang/srt/server_args.py, 0.5.14). The two runners of
one format differ by up to 2-3x at large token counts (AIConfigurator 0.12's GB200 bf16 tables: ~1,000 TFLOPS for
the Qwen3 shapes on flashinfer_trtllm, ~400 for Mixtral's and Llama 4's on Triton), so each runner has its own
kernel model: the calibration's `moe.<format>` prices the engine's default runner, `moe.<format>_<runner>` another
one. Every rule holds only without an all-to-all backend (dispatch-style expert parallelism), as in the engine.

A rule may also hold only for a step's size and layout: TensorRT-LLM through 0.20 ran DeepSeek-V3's nvfp4 experts on
the CUTLASS MoE's min-latency flow at 128 tokens a step or fewer, with the MoE's allreduce fused into the layer
(`max_tokens`, `tp_allreduce`, `before_release`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from .common import release_key

DATA = "moe_runners.json"


@lru_cache(maxsize=1)
def _data() -> dict:
    return json.loads((resources.files("cost.engine_kernels") / DATA).read_text())


@lru_cache(maxsize=1)
def runners() -> tuple[str, ...]:
    """Every runner some engine keeps a kernel model of its own for."""
    return tuple(sorted({r["runner"] for entry in _data().values() for r in entry["rules"]}))


def moe_key(fmt: str, runner: str = "") -> str:
    """The calibration key of a format's kernel model on a runner ("" or the default: the format itself)."""
    return f"{fmt}_{runner}" if runner else fmt


def split_key(key: str) -> tuple[str, str]:
    """A MoE kernel model key as (weight format, runner): "fp8_block_flashinfer_trtllm" -> ("fp8_block",
    "flashinfer_trtllm"); a plain format has runner ""."""
    for runner in runners():
        if key.endswith(f"_{runner}"):
            return key.removesuffix(f"_{runner}"), runner
    return key, ""


def key_format(key: str) -> str:
    """The weight format of a MoE kernel model key ("fp8_block_flashinfer_trtllm" -> "fp8_block")."""
    return split_key(key)[0]


def table_runner(engine: str, fmt: str, kernel_source: str) -> str:
    """The runner a kernel-table row of `kernel_source` was timed on, where the engine's rows of that format split
    between runners; "" for the default runner (and every format that does not split)."""
    entry = _data().get(engine)
    if not entry or fmt not in entry["formats"]:
        return ""
    # the longest source that names the row's kernel ("moe_torch_flow" is also in "moe_torch_flow_min_latency")
    named = [source for source in entry["table_sources"] if source in kernel_source]
    if not named:
        return ""
    runner = entry["table_sources"][max(named, key=len)]
    return "" if runner == entry["default"] else runner


@dataclass(frozen=True)
class RunnerChoice:
    runner: str       # "" for the engine's default runner
    label: str        # what the notes call it: "SGLang 0.5.14's flashinfer_trtllm MoE runner"
    source: str       # the engine source of the rule
    architecture: str
    when: str = ""    # the step sizes and layouts it holds for, where the rule has any

    @property
    def source_file(self) -> str:
        return self.source.split(" ", 1)[0]


def _holds(rule: dict, tokens: float | None, tp_allreduce: bool, release: str) -> bool:
    """A rule's step and layout conditions; a step of unknown size (None) meets no token bound."""
    if "max_tokens" in rule and (tokens is None or tokens > rule["max_tokens"]):
        return False
    if rule.get("tp_allreduce") and not tp_allreduce:
        return False
    if "before_release" not in rule:
        return True
    return bool(release) and release_key(release) < release_key(rule["before_release"])   # "": the newest


def _when(rule: dict) -> str:
    parts = []
    if "max_tokens" in rule:
        parts.append(f"at {rule['max_tokens']} tokens a step or fewer")
    if rule.get("tp_allreduce"):
        parts.append("with the MoE's tensor-parallel allreduce fused into the layer (no attention DP)")
    if "before_release" in rule:
        parts.append(f"in releases before {rule['before_release']}")
    return ", ".join(parts)


def model_runner(engine: str, profile_key: str, architecture: str, fmt: str, all_to_all: bool = False,
                 tokens: float | None = None, tp_allreduce: bool = False, release: str = "") -> RunnerChoice | None:
    """The runner the engine's default launch takes for a model's routed experts in `fmt` on a device; None where
    it runs its default one (or tracecost has no rules for the engine). `tokens`: the tokens one call of the layer
    runs on a rank (None: not known); `tp_allreduce`: its output is reduced across tensor-parallel ranks (tensor
    parallelism without attention DP); `release`: the engine release priced ("": the newest)."""
    entry = _data().get(engine)
    if not entry or all_to_all or not architecture:
        return None
    for rule in entry["rules"]:
        devices = rule["devices"]
        if architecture in rule["architectures"] and fmt in rule["formats"] and \
                (devices == "*" or profile_key in devices) and _holds(rule, tokens, tp_allreduce, release):
            return RunnerChoice(rule["runner"], f"{entry['label']} {entry['release']}'s {rule['runner']} MoE runner",
                                rule["source"], architecture, _when(rule))
    return None
