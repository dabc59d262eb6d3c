"""Serving engines as tracecost prices them: one entry per engine, the behaviour its kernel models assume.

The kernel times themselves are fitted per device and engine (`hw_profiles/*.json`, section `engines`);
what lives here is how each engine composes kernels into a step.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Engine:
    name: str
    label: str
    # the engine's own all-reduce serves messages up to this size over NVLink, NCCL the rest
    custom_allreduce_max_bytes: int
    # GPU counts the custom all-reduce supports; on PCIe-only machines it serves at most two GPUs
    custom_allreduce_gpus: tuple[int, ...] = (2, 4, 6, 8)
    pcie_custom_allreduce_max_gpus: int = 2


# vLLM: vllm/distributed/device_communicators/custom_all_reduce.py (max_size 8 MiB; world sizes 2, 4, 6, 8;
# disabled on more than two PCIe-only GPUs). SGLang ships the same kernel (sgl-kernel custom_all_reduce).
# TensorRT-LLM: its AllReduce plugin's one-/two-shot kernels serve up to the same order of message size.
ENGINES: dict[str, Engine] = {
    "vllm": Engine("vllm", "vLLM", custom_allreduce_max_bytes=8 * 2**20),
    "sglang": Engine("sglang", "SGLang", custom_allreduce_max_bytes=8 * 2**20),
    "trtllm": Engine("trtllm", "TensorRT-LLM", custom_allreduce_max_bytes=8 * 2**20),
}
DEFAULT_ENGINE = "vllm"
