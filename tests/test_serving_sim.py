"""Hand-checkable cases of the block-level prefix-cache simulation."""
import json

import pytest

from cli.inference.serving_sim import main
from cost.profile import load_profile
from serving.block_cache import BlockPool
from serving.simulator import ServerConfig, StepCost, simulate
from serving.workload import PresetSizes, SimRequest, WorkloadError, load_jsonl, preset
from tracer import TraceOptions, resolve_model


@pytest.fixture(scope="module")
def cost():
    return StepCost(resolve_model("llama-3.2-1b"), load_profile("h100"), TraceOptions(), "engine", 1)


def shared_prompt(n, prompt=2048, user=64, out=8):
    return [SimRequest(i, 0.0, prompt + user, out, segments=[("system", prompt), (f"u{i}", user)]) for i in range(n)]


def test_shared_prompt_with_ample_cache_matches_closed_form(cost):
    n, bs = 50, 16
    res = simulate(shared_prompt(n), cost, ServerConfig(block_size=bs, gpu_blocks=100_000, block_bytes=1))
    # the first request computes everything; every later one reuses the 128 full system-prompt blocks
    system_blocks = 2048 // bs
    assert res.reused_tokens == (n - 1) * system_blocks * bs
    assert res.prompt_tokens == n * (2048 + 64)
    assert res.completed == n and res.rejected == 0


def test_cache_smaller_than_one_prompt_gives_no_hits(cost):
    reqs = shared_prompt(10, prompt=2048, user=64, out=4)
    needed = (2048 + 64 + 4 + 15) // 16
    res = simulate(reqs, cost, ServerConfig(block_size=16, gpu_blocks=needed, block_bytes=1, max_running=1))
    assert res.completed == 10
    res_small = simulate(shared_prompt(10), cost, ServerConfig(block_size=16, gpu_blocks=needed - 1, block_bytes=1))
    assert res_small.rejected == 10 and res_small.completed == 0 and res_small.reused_tokens == 0


def test_block_boundary_rounding():
    r = SimRequest(0, 0.0, 40, 1, segments=[("a", 40)])
    r.hash_blocks(16)
    assert len(r.block_hashes) == 2  # the partial third block has no identity
    s = SimRequest(1, 0.0, 40, 1, segments=[("a", 33), ("b", 7)])
    s.hash_blocks(16)
    # the first two blocks hold only run "a", the same as r's; the third is partial in both
    assert s.block_hashes == r.block_hashes
    t = SimRequest(2, 0.0, 40, 1, segments=[("a", 31), ("c", 9)])
    t.hash_blocks(16)
    assert t.block_hashes[0] == r.block_hashes[0] and t.block_hashes[1] != r.block_hashes[1]
    ids = SimRequest(3, 0.0, 20, 1, token_ids=list(range(20)))
    ids.hash_blocks(8)
    same = SimRequest(4, 0.0, 17, 1, token_ids=list(range(17)))
    same.hash_blocks(8)
    assert ids.block_hashes == same.block_hashes


def test_timestamp_first_collapses_reuse(cost):
    sizes = PresetSizes(system_tokens=1024, user_tokens=32, output_tokens=4)
    cfg = ServerConfig(block_size=16, gpu_blocks=100_000, block_bytes=1)
    shared = simulate(preset("shared-system-prompt", 40, None, 0, sizes), cost, cfg)
    stamped = simulate(preset("timestamp-first", 40, None, 0, sizes), cost, cfg)
    assert shared.reused_tokens > 0.9 * 39 * 1024
    assert stamped.reused_tokens == 0


def test_deterministic_for_a_seed(cost):
    sizes = PresetSizes(system_tokens=256, user_tokens=32, output_tokens=8, turns=3)
    cfg = ServerConfig(block_size=16, gpu_blocks=2000, block_bytes=1)
    a = simulate(preset("multi-turn-chat", 60, 50.0, 7, sizes), cost, cfg).summary(cfg)
    b = simulate(preset("multi-turn-chat", 60, 50.0, 7, sizes), cost, cfg).summary(cfg)
    c = simulate(preset("multi-turn-chat", 60, 50.0, 8, sizes), cost, cfg).summary(cfg)
    assert a == b and a != c


def test_cpu_tier_helps_on_fast_link_and_is_skipped_on_slow(cost):
    # two documents alternate through a GPU cache that holds one: evicted blocks go to the CPU tier
    reqs = [SimRequest(i, float(i), 4096 + 16, 2, segments=[(f"doc{i % 2}", 4096), (f"q{i}", 16)])
            for i in range(12)]
    gpu_blocks = (4096 + 16 + 2) // 16 + 20
    fast = ServerConfig(block_size=16, gpu_blocks=gpu_blocks, cpu_blocks=10_000, block_bytes=16 * 32768,
                        host_link_bytes_per_s=64e9, max_running=1)
    slow = ServerConfig(block_size=16, gpu_blocks=gpu_blocks, cpu_blocks=10_000, block_bytes=16 * 32768,
                        host_link_bytes_per_s=1e6, max_running=1)
    none = ServerConfig(block_size=16, gpu_blocks=gpu_blocks, cpu_blocks=0, block_bytes=16 * 32768, max_running=1)
    r_fast, r_slow, r_none = (simulate(reqs, cost, c) for c in (fast, slow, none))
    assert r_fast.cpu_hit_blocks > 0 and r_fast.cpu_transfer_s < r_fast.cpu_saved_compute_s
    assert r_fast.reused_tokens > r_none.reused_tokens
    assert r_slow.cpu_hit_blocks == 0 and r_slow.reused_tokens == r_none.reused_tokens
    assert r_fast.makespan_s < r_none.makespan_s


def test_no_request_is_lost(cost):
    sizes = PresetSizes(system_tokens=512, user_tokens=64, output_tokens=16, documents=3, document_tokens=3000)
    for name in ("shared-system-prompt", "multi-turn-chat", "document-qa", "timestamp-first"):
        reqs = preset(name, 80, 100.0, 1, sizes)
        cfg = ServerConfig(block_size=16, gpu_blocks=400, block_bytes=1)
        res = simulate(reqs, cost, cfg)
        assert res.completed + res.rejected == 80, name
        assert len(res.ttft_s) == res.completed


def test_block_pool_lru_and_pinning():
    pool = BlockPool(gpu_blocks=4, cpu_blocks=2)
    assert pool.allocate([1, 2], 0, 0, 0)
    assert pool.match([1, 2, 3]) == (2, 0)
    pool.release([1, 2], 0)
    assert pool.allocate([3, 4], 0, 0, 1)   # 3 free slots needed: one evicts LRU block 1 to the CPU tier
    assert pool.match([1, 2]) == (0, 1)
    assert not pool.allocate([5, 6, 7], 0, 0, 0)  # block 2 evictable, but 3 and 4 are pinned


def test_jsonl_errors_name_the_line(tmp_path):
    f = tmp_path / "w.jsonl"
    f.write_text('{"arrival_s": 0, "segments": [{"id": "s", "tokens": 10}], "output_tokens": 2}\n{"arrival_s": 1}\n')
    with pytest.raises(WorkloadError, match=":2:"):
        load_jsonl(f)
    f.write_text('{"arrival_s": 0.5, "token_ids": [1, 2, 3], "output_tokens": 2}\n')
    assert load_jsonl(f)[0].prompt_tokens == 3


def test_cli_json_and_errors(tmp_path, capsys):
    assert main(["llama-3.2-1b", "--device", "h100", "--workload", "shared-system-prompt", "--num-requests", "30",
                 "--system-tokens", "512", "--output-tokens", "8", "--compare", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["runs"]) == {"no-cache", "gpu", "gpu+cpu"}
    for run in out["runs"].values():
        for key in ("hit_rate", "block_hit_rate", "reused_tokens", "ttft_ms", "tpot_ms", "prefill_tokens_per_s",
                    "output_tokens_per_s", "kv_memory_gb", "eviction_rate", "cpu_tier", "completed_requests",
                    "rejected_requests"):
            assert key in run
    assert out["runs"]["no-cache"]["hit_rate"] == 0 < out["runs"]["gpu"]["hit_rate"]
    assert out["runs"]["gpu"]["ttft_ms"]["p50"] < out["runs"]["no-cache"]["ttft_ms"]["p50"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    assert main(["llama-3.2-1b", "--device", "h100", "--workload", str(bad)]) == 2
    assert ":1:" in capsys.readouterr().err
    assert main(["llama-3.2-1b", "--device", "h100", "--workload", "no-such-preset"]) == 2


def test_without_prefix_caching_identical_prompts_hold_their_own_blocks(cost):
    reqs = shared_prompt(4, prompt=1024, user=16, out=4)
    per_request = -(-(1024 + 16 + 4) // 16)
    cfg = ServerConfig(block_size=16, gpu_blocks=100_000, block_bytes=1, prefix_caching=False)
    res = simulate(reqs, cost, cfg)
    assert res.reused_tokens == 0 and res.gpu_blocks_peak == 4 * per_request
    shared = simulate(shared_prompt(4, prompt=1024, user=16, out=4), cost, ServerConfig(block_size=16,
                                                                                        gpu_blocks=100_000,
                                                                                        block_bytes=1))
    assert shared.gpu_blocks_peak < res.gpu_blocks_peak
