"""--cache-policy vllm against vLLM's own KV cache manager, on the same request streams.

Both arms run tracecost's engine loop (serving/engine.py: vLLM's FCFS scheduling with chunked prefill,
on-demand allocation and preemption) with the same step times; they differ only in the cache: tracecost's
serving/vllm_cache.py, or vLLM's real KVCacheManager (vllm/v1/core/kv_cache_manager.py with its block pool,
coordinator and single-type managers), driven through the calls vLLM's Scheduler makes:
get_computed_blocks at admission, allocate_slots (full_sequence_must_fit for admissions), free on
finish and preemption. Hit rates are vLLM's PrefixCacheStats definition (hits / prompt tokens of first
admissions); evictions count blocks whose hash was dropped when handed out again.

Needs a vLLM source tree and the few pure-Python packages its core imports, e.g.
    pip download --no-deps vllm==0.33.0 && unzip -q vllm-0.33.0-*.whl 'vllm/*' -d /tmp/vllm-src
    pip install --target /tmp/vllm-deps psutil pyzmq msgspec cbor2 cachetools cloudpickle py-cpuinfo pybase64
    python bench/vllm_parity.py --vllm-src /tmp/vllm-src --deps /tmp/vllm-deps [--mooncake FILE]
vLLM's request object, its config module and a few network packages are stubbed at run time: the cache
manager only reads a handful of request fields, listed in _Request.
"""
from __future__ import annotations

import argparse
import enum
import importlib.abc
import importlib.machinery
import json
import random
import sys
import time
import types
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STUBBED = ("vllm.config", "vllm.multimodal", "urllib3", "uvloop", "requests", "prometheus_client")


class _Stub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if any(name == s or name.startswith(s + ".") for s in STUBBED):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = mock.MagicMock(name=spec.name)
        module.__path__, module.__spec__ = [], spec
        return module

    def exec_module(self, module):
        pass


class _Status(enum.IntEnum):
    WAITING = 1
    RUNNING = 2
    PREEMPTED = 3


class _Request:
    """The fields of vllm.v1.request.Request that the KV cache manager reads."""

    def __init__(self, rid: int):
        self.request_id = str(rid)
        self.block_hashes: list[bytes] = []
        self.num_tokens = self.num_prompt_tokens = self.num_computed_tokens = 0
        self.status = _Status.WAITING
        self.num_preemptions = self.num_in_flight_tokens = self.shared_prefix_boundary = 0
        self.skip_reading_prefix_cache = False
        self.lora_request = self.session_id = None
        self.mm_features, self.all_token_ids = [], []


def import_vllm(src: str, deps: str | None):
    sys.path.insert(0, src)
    if deps:
        sys.path.append(deps)
    sys.meta_path.insert(0, _Stub())
    fake = types.ModuleType("vllm.v1.request")
    fake.Request, fake.RequestStatus = _Request, _Status
    sys.modules["vllm.v1.request"] = fake
    import torch
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    return torch, KVCacheManager, FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec


class VllmManagerCache:
    """tracecost's cache interface over vLLM's KVCacheManager."""
    name = "vllm-real"

    def __init__(self, vllm, num_blocks: int, block_size: int):
        torch, KVCacheManager, FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec = vllm
        spec = FullAttentionSpec(block_size=block_size, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
        config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                               kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
        self.manager = KVCacheManager(config, max_model_len=1 << 22, scheduler_block_size=block_size,
                                      hash_block_size=block_size, enable_caching=True)
        self.pool = self.manager.block_pool
        self.block_size, self.decode_granule = block_size, 1   # every step goes through allocate_slots
        self.capacity_blocks = num_blocks - 1
        self.allocated_blocks = 0
        self.evicted_blocks = 0
        self.requests: dict[int, _Request] = {}
        original = self.pool._maybe_evict_cached_block

        def counted(block):
            evicted = original(block)
            self.evicted_blocks += evicted
            return evicted
        self.pool._maybe_evict_cached_block = counted

    @property
    def used_blocks(self) -> int:
        return self.capacity_blocks - self.pool.get_num_free_blocks()

    @property
    def evictable_blocks(self) -> int:
        return 0

    def _request(self, seq) -> _Request:
        r = self.requests.get(seq.sid)
        if r is None:
            r = self.requests[seq.sid] = _Request(seq.sid)
            r.num_prompt_tokens = seq.req.prompt_tokens
            r._all = [h.to_bytes(8, "little", signed=True) for h in seq.hashes]
        r.num_tokens = seq.num_tokens
        r.num_computed_tokens = seq.num_computed
        r.block_hashes = r._all[:seq.num_tokens // self.block_size]
        return r

    def cannot_admit(self, seq) -> bool:
        return False

    def grow_all(self, seqs, steps: int) -> bool:
        return False   # vLLM's manager is driven one step at a time, as its scheduler does

    def peek(self, seq) -> int:
        return self.lookup(seq)[1]

    def lookup(self, seq):
        blocks, hit, _ = self.manager.get_computed_blocks(self._request(seq))
        return blocks, hit

    def allocate(self, seq, num_new, hit=None, hit_tokens=0, external=0, full_must_fit=False) -> bool:
        r = self._request(seq)
        if full_must_fit:
            r.status = _Status.PREEMPTED if r.num_preemptions else _Status.WAITING
        blocks = self.manager.allocate_slots(r, num_new, num_new_computed_tokens=hit_tokens,
                                             new_computed_blocks=hit, num_external_computed_tokens=external,
                                             full_sequence_must_fit=full_must_fit)
        if blocks is None:
            return False
        r.status = _Status.RUNNING
        self.allocated_blocks += max(0, len(blocks.get_block_ids()[0]))
        return True

    def prefill_chunk_done(self, seq) -> None:
        pass

    def free_seq(self, seq, finished: bool) -> None:
        r = self._request(seq)
        self.manager.free(r)
        if not finished:
            r.num_preemptions += 1


def workloads(args) -> dict:
    from serving.traces import load_mooncake
    from serving.workload import PresetSizes, SimRequest, preset
    out = {
        "document-qa": preset("document-qa", 400, 4.0, 1, PresetSizes(documents=12, document_tokens=8192)),
        "multi-turn chat": preset("multi-turn-chat", 1200, 8.0, 2, PresetSizes(system_tokens=2048, turns=6,
                                                                                output_tokens=512)),
    }
    rng = random.Random(3)
    whole = [SimRequest(i, i * 0.05, 2048, 64, segments=[(f"prompt-{rng.randrange(40)}", 2048)]) for i in range(800)]
    out["repeated whole prompts"] = whole
    if args.mooncake:
        out["mooncake conversation"] = load_mooncake(args.mooncake)[:args.mooncake_requests]
    return out


POOLS_GB = {"document-qa": 6, "multi-turn chat": 2, "repeated whole prompts": 2, "mooncake conversation": 8}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vllm-src", required=True, help="folder holding the vllm package (e.g. an unzipped wheel)")
    p.add_argument("--deps", default=None, help="folder of vLLM's pure-Python imports (pip install --target)")
    p.add_argument("--mooncake", default=None, help="a Mooncake trace (FAST25-release/traces/*.jsonl)")
    p.add_argument("--mooncake-requests", type=int, default=3000)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    vllm = import_vllm(args.vllm_src, args.deps)
    from cost.profile import load_profile
    from serving.simulator import ServerConfig, StepCost, simulate
    from tracer import TraceOptions, resolve_model
    cost = StepCost(resolve_model("llama-3.1-8b"), load_profile("h100"), TraceOptions(), "engine", 1)
    block_bytes = 16 * 131072
    rows = []
    for name, requests in workloads(args).items():
        cfg = ServerConfig(block_size=16, gpu_blocks=int(POOLS_GB[name] * 1e9 // block_bytes), block_bytes=block_bytes)
        t = time.perf_counter()
        ours = simulate(requests, cost, cfg)
        t_ours = time.perf_counter() - t
        with mock.patch("serving.simulator.make_cache", lambda *a: VllmManagerCache(vllm, cfg.gpu_blocks, 16)):
            t = time.perf_counter()
            theirs = simulate(requests, cost, cfg)
            t_theirs = time.perf_counter() - t
        a, b = ours.summary(cfg), theirs.summary(cfg)
        rows.append({"trace": name, "requests": len(requests), "gpu_cache_gb": POOLS_GB[name],
                     "hit_rate_tracecost": a["hit_rate"], "hit_rate_vllm": b["hit_rate"],
                     "hit_gap_points": (a["hit_rate"] - b["hit_rate"]) * 100,
                     "evictions_tracecost": a["evictions"]["blocks"], "evictions_vllm": b["evictions"]["blocks"],
                     "eviction_gap_pct": 100 * (a["evictions"]["blocks"] - b["evictions"]["blocks"])
                     / max(1, b["evictions"]["blocks"]),
                     "preemptions_tracecost": a["preemptions"]["count"], "preemptions_vllm": b["preemptions"]["count"],
                     "seconds_tracecost": t_ours, "seconds_vllm": t_theirs})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    from tracer.table import format_table
    print(format_table(
        ["trace", "requests", "GPU GB", "hit tracecost", "hit vLLM", "gap pts", "evictions tracecost",
         "evictions vLLM", "gap", "preemptions (t / v)"],
        [[r["trace"], r["requests"], r["gpu_cache_gb"], f"{r['hit_rate_tracecost'] * 100:.2f}%",
          f"{r['hit_rate_vllm'] * 100:.2f}%", f"{r['hit_gap_points']:+.2f}", f"{r['evictions_tracecost']:,}",
          f"{r['evictions_vllm']:,}", f"{r['eviction_gap_pct']:+.1f}%",
          f"{r['preemptions_tracecost']} / {r['preemptions_vllm']}"] for r in rows],
        title="--cache-policy vllm vs vLLM 0.33 KVCacheManager (llama-3.1-8b step times on H100, block size 16)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
