"""Hand-checkable cases of the block-level prefix-cache simulation."""
import json
from pathlib import Path

import pytest

from cli.inference.serving_sim import main
from cost.profile import load_profile
from serving.simulator import ServerConfig, StepCost, simulate
from serving.traces import load_jsonl, load_mooncake
from serving.workload import PresetSizes, SimRequest, WorkloadError, preset
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


def test_requests_longer_than_the_cache_are_rejected(cost):
    needed = (2048 + 64 + 4 + 15) // 16
    res = simulate(shared_prompt(10, out=4), cost, ServerConfig(block_size=16, gpu_blocks=needed + 1, block_bytes=1,
                                                                max_running=1))   # + vLLM's null block
    assert res.completed == 10
    res_small = simulate(shared_prompt(10, out=4), cost, ServerConfig(block_size=16, gpu_blocks=needed,
                                                                      block_bytes=1))
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
    assert r_fast.cpu_hit_blocks > 0 and r_fast.cpu_load_s < r_fast.cpu_saved_compute_s
    assert r_fast.cpu_stored_blocks >= 2 * 4096 // 16   # both documents written through at prefill end
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


def test_jsonl_errors_name_the_line(tmp_path):
    f = tmp_path / "w.jsonl"
    f.write_text('{"arrival_s": 0, "segments": [{"id": "s", "tokens": 10}], "output_tokens": 2}\n{"arrival_s": 1}\n')
    with pytest.raises(WorkloadError, match=":2:"):
        load_jsonl(f)
    f.write_text('{"arrival_s": 0.5, "token_ids": [1, 2, 3], "output_tokens": 2}\n')
    assert load_jsonl(f)[0].prompt_tokens == 3


METRIC_KEYS = ("hit_rate", "hit_rate_by_tier", "reused_tokens", "prompt_tokens", "session_hit_rate", "ttft_ms",
               "ttft_ms_hit", "ttft_ms_miss", "tpot_ms", "computed_prefill_tokens_per_s", "prompt_tokens_per_s",
               "output_tokens_per_s", "kv_memory_gb", "gpu_kv_usage_mean", "evictions", "preemptions", "cpu_tier",
               "hit_rate_over_time", "instances", "completed_requests", "rejected_requests", "makespan_s")


def test_cli_json_and_errors(tmp_path, capsys):
    assert main(["llama-3.2-1b", "--device", "h100", "--workload", "shared-system-prompt", "--num-requests", "30",
                 "--system-tokens", "512", "--output-tokens", "8", "--compare", "--json", "--jobs", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["runs"]) == {"no-cache", "gpu", "gpu+cpu"}
    for run in out["runs"].values():
        assert set(METRIC_KEYS) <= set(run)
        assert set(run["kv_memory_gb"]) >= {"gpu_used_mean", "gpu_used_peak", "gpu_evictable_mean", "gpu_capacity",
                                            "cpu_mean", "cpu_peak"}
        assert set(run["evictions"]) >= {"blocks", "re_needed_blocks"}
        assert set(run["cpu_tier"]) >= {"hit_blocks", "load_ms", "store_ms", "dropped_blocks", "stored_blocks"}
        assert set(run["ttft_ms_hit"]) >= {"p50", "p90", "p99", "requests"}
    assert out["runs"]["no-cache"]["hit_rate"] == 0 < out["runs"]["gpu"]["hit_rate"]
    assert out["runs"]["gpu"]["ttft_ms"]["p50"] < out["runs"]["no-cache"]["ttft_ms"]["p50"]
    gpu = out["runs"]["gpu"]
    assert gpu["ttft_ms_hit"]["requests"] + gpu["ttft_ms_miss"]["requests"] == 30
    # computed prefill counts only what was not reused
    assert gpu["computed_prefill_tokens_per_s"] < gpu["prompt_tokens_per_s"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    assert main(["llama-3.2-1b", "--device", "h100", "--workload", str(bad)]) == 2
    assert ":1:" in capsys.readouterr().err
    assert main(["llama-3.2-1b", "--device", "h100", "--workload", "no-such-preset"]) == 2
    for flags in (["--sweep-gpu-cache-gb", "8,x"], ["--sweep-gpu-cache-gb", "0"], ["--time-scale", "0"],
                  ["--sweep-gpu-cache-gb", "8", "--compare"], ["--cache-policy", "trtllm"], ["--instances", "0"]):
        with pytest.raises(SystemExit) as e:
            main(["llama-3.2-1b", "--device", "h100", "--workload", "shared-system-prompt", *flags])
        assert e.value.code == 2, flags
    assert main(["llama-3.2-1b", "--device", "h100", "--workload", "shared-system-prompt", "--gpu-cache-gb",
                 "0.000001"]) == 2
    assert "too small" in capsys.readouterr().err


def test_without_prefix_caching_identical_prompts_hold_their_own_blocks(cost):
    reqs = shared_prompt(4, prompt=1024, user=16, out=4)
    per_request = -(-(1024 + 16 + 4) // 16)
    cfg = ServerConfig(block_size=16, gpu_blocks=100_000, block_bytes=1, prefix_caching=False, api_server=False)
    res = simulate(reqs, cost, cfg)
    assert res.reused_tokens == 0 and res.gpu_used_peak == 4 * per_request
    shared = simulate(shared_prompt(4, prompt=1024, user=16, out=4), cost, ServerConfig(block_size=16,
                                                                                        gpu_blocks=100_000,
                                                                                        block_bytes=1))
    assert shared.gpu_used_peak < res.gpu_used_peak


SAMPLE = Path(__file__).parent / "data" / "mooncake_conversation_300.jsonl"


def test_mooncake_parser_reads_the_released_format(tmp_path):
    reqs = load_mooncake(SAMPLE)
    raw = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    assert len(reqs) == len(raw) == 300
    for r, d in zip(reqs, raw):
        assert r.prompt_tokens == d["input_length"] and r.output_tokens == d["output_length"]
        assert r.arrival_s == d["timestamp"] / 1000
        assert [n for _, n in r.segments][:-1] == [512] * (len(d["hash_ids"]) - 1)
        assert r.segments[-1][1] == d["input_length"] - 512 * (len(d["hash_ids"]) - 1)
    bad = tmp_path / "m.jsonl"
    bad.write_text(SAMPLE.read_text().splitlines()[0] + '\n{"timestamp": 5, "input_length": 2000, '
                   '"output_length": 3, "hash_ids": [1, 2]}\n')
    with pytest.raises(WorkloadError, match=r":2:.*expected ceil"):
        load_mooncake(bad)


def known_hits(path, block_size=16, block_tokens=512) -> int:
    """Tokens an unbounded cache hits: each request reuses its leading hash ids seen before (the ids are prefix
    hashes), at most input length - 1 tokens, in whole blocks."""
    seen, total = set(), 0
    for line in Path(path).read_text().splitlines():
        d = json.loads(line)
        ids, n = d["hash_ids"], d["input_length"]
        k = 0
        while k < len(ids) and ids[k] in seen:
            k += 1
        tokens = sum(min(block_tokens, n - block_tokens * i) for i in range(k))
        total += min(tokens, n - 1) // block_size * block_size
        seen.update(ids)
    return total


def test_mooncake_sample_hits_what_an_unbounded_cache_would(cost):
    # every prompt is scheduled whole on arrival (huge step budget) and nothing is evicted
    cfg = ServerConfig(block_size=16, gpu_blocks=10_000_000, block_bytes=1, max_prefill_tokens=10_000_000,
                       max_running=10_000)
    res = simulate(load_mooncake(SAMPLE), cost, cfg)
    assert res.completed == 300 and res.evicted_blocks == 0
    assert res.reused_tokens == known_hits(SAMPLE) == 345_952


def test_cpu_pool_is_shared_by_instances_and_reports_tiers_and_drops(cost):
    reqs = [SimRequest(i, 2.0 * i, 4096 + 16, 2, segments=[("doc", 4096), (f"q{i}", 16)]) for i in range(2)]
    cfg = ServerConfig(block_size=16, gpu_blocks=2000, cpu_blocks=10_000, block_bytes=16 * 32768, instances=2)
    res = simulate(reqs, cost, cfg)
    first, second = res.records
    assert (first.instance, second.instance) == (0, 1)
    # the second instance never saw the document: it loads it from the CPU pool written by the first
    assert second.gpu_hit_tokens == 0 and second.cpu_hit_tokens == 4096
    s = res.summary(cfg)
    assert s["hit_rate_by_tier"]["cpu"] > 0 == s["hit_rate_by_tier"]["gpu"]
    # 256 document blocks + each question's block; the document is stored once
    assert s["cpu_tier"]["stored_blocks"] == 4096 // 16 + 2 and s["cpu_tier"]["store_ms"] > 0
    tiny = simulate(reqs, cost, ServerConfig(block_size=16, gpu_blocks=2000, cpu_blocks=100, block_bytes=16 * 32768,
                                             instances=2))
    # 100 blocks: the first write drops 157; the second request finds the head gone, and writing its 257
    # blocks in order drops each one's successor before it is reached: all 257 are new, 257 more drops
    assert tiny.cpu_dropped_blocks == 157 + 257
    assert tiny.records[1].cpu_hit_tokens == 0          # the document's head was dropped


def test_cache_aware_routing_keeps_documents_on_one_instance(cost):
    reqs = [SimRequest(i, 0.5 * i, 2048 + 16, 2, segments=[(f"doc{i % 3}", 2048), (f"q{i}", 16)]) for i in range(30)]
    hits = {}
    for routing in ("round-robin", "cache-aware"):
        cfg = ServerConfig(block_size=16, gpu_blocks=2 * 130 + 20, block_bytes=1, instances=2, routing=routing)
        hits[routing] = simulate(reqs, cost, cfg).reused_tokens
    assert hits["cache-aware"] > hits["round-robin"]


def test_hit_rate_over_time_shows_the_warm_up(cost):
    reqs = preset("shared-system-prompt", 200, 20.0, 0, PresetSizes(system_tokens=1024, output_tokens=4))
    cfg = ServerConfig(block_size=16, gpu_blocks=100_000, block_bytes=1)
    points = simulate(reqs, cost, cfg).summary(cfg, window_s=1.0)["hit_rate_over_time"]["points"]
    assert points[0]["hit_rate"] < points[-1]["hit_rate"]
    assert sum(p["requests"] for p in points) == 200


def test_sglang_policy_runs_the_presets(cost):
    sizes = PresetSizes(system_tokens=512, user_tokens=20, output_tokens=16, documents=3, document_tokens=3000)
    for name in ("multi-turn-chat", "document-qa"):
        for policy in ("vllm", "sglang"):
            cfg = ServerConfig(block_size=16, gpu_blocks=400, block_bytes=1, cache_policy=policy)
            res = simulate(preset(name, 60, 50.0, 1, sizes), cost, cfg)
            assert res.completed + res.rejected == 60 and res.reused_tokens > 0, (name, policy)


def test_cli_mooncake_sweep_and_plot(tmp_path, capsys):
    png = tmp_path / "sweep.png"
    assert main(["llama-3.2-1b", "--device", "h100", "--workload", f"mooncake:{SAMPLE}", "--time-scale", "0.2",
                 "--sweep-gpu-cache-gb", "1,4", "--plot", str(png), "--jobs", "1"]) == 0
    captured = capsys.readouterr()
    assert "hit rate vs GPU cache capacity" in captured.out
    try:
        import matplotlib  # noqa: F401
        assert png.exists()
    except ImportError:
        assert "needs matplotlib" in captured.err and not png.exists()
    assert main(["llama-3.2-1b", "--device", "h100", "--workload", f"mooncake:{SAMPLE}", "--json",
                 "--sweep-gpu-cache-gb", "1,4", "--jobs", "2"]) == 0   # two processes sharing traced shapes
    sweep = json.loads(capsys.readouterr().out)["sweep"]
    assert [s["gpu_cache_gb"] for s in sweep] == [1, 4] and all(0 <= s["hit_rate"] < 1 for s in sweep)


def test_shared_hashing_gives_each_request_the_hashes_it_computes_alone():
    """hash_requests' memo (one per workload) against hashing each request on its own, on segments that do not
    align to blocks, repeated prefixes, token-id prompts and block sizes 1, 5 and 16."""
    import random

    from serving.workload import hash_requests

    def workload():
        rng = random.Random(7)
        reqs = preset("multi-turn-chat", 60, None, 1, PresetSizes(system_tokens=37, user_tokens=5, output_tokens=11))
        reqs += preset("document-qa", 30, None, 2, PresetSizes(documents=3, document_tokens=50, question_tokens=3))
        reqs += [SimRequest(200 + i, 0.0, n, 3, token_ids=[rng.randrange(3) for _ in range(n)])
                 for i, n in enumerate(rng.randrange(1, 40) for _ in range(30))]
        return reqs
    for bs in (1, 5, 16):
        alone, shared = workload(), workload()
        for r in alone:
            r.hash_blocks(bs)
        hash_requests(shared, bs)
        assert [r.block_hashes for r in shared] == [r.block_hashes for r in alone]
        assert all(len(r.block_hashes) == (r.prompt_tokens + r.output_tokens) // bs for r in shared)
        assert len({r.block_hashes[0] for r in shared[:60]}) == 1   # the system prompt's first block


def test_decode_run_pricing_is_one_call_per_step(cost):
    """StepCost.decode_attention_from over a run of contexts: the same floats as decode_attention for each,
    across bucket points (powers of two) and from context 0."""
    for batch, start, limit in ((1, 0, 5), (3, 1, 9), (7, 250, 40), (64, 1023, 3), (200, 1024, 7), (5, 3000, 2000)):
        context, got = start, []
        while len(got) < limit:
            part = cost.decode_attention_from(batch, context, limit - len(got)).tolist()
            assert part, (batch, context)
            got += part
            context += len(part)
        assert got == [cost.decode_attention(batch, start + j) for j in range(limit)]


def test_a_decode_run_costs_what_its_steps_cost_one_by_one(cost, monkeypatch):
    """The simulator takes runs of pure-decode steps together (serving/engine.py _decode_run). Priced one step at
    a time instead (StepCost.step: the widened head's logits, the overheads), every request ends at the same
    moment, to float rounding."""
    from serving.engine import Engine

    def run():
        reqs = [SimRequest(i, 0.002 * i, 300 + 7 * i, 120 + 3 * i, segments=[(f"p{i}", 300 + 7 * i)])
                for i in range(12)]
        return simulate(reqs, cost, ServerConfig(gpu_blocks=4000, api_server=False))
    together = run()
    monkeypatch.setattr(Engine, "_decode_run", lambda self, horizon: False)
    apart = run()
    assert together.steps == apart.steps
    assert together.makespan_s == pytest.approx(apart.makespan_s, rel=1e-9)
    ends = lambda res: sorted((r.rid, r.finish_s) for r in res.records)    # noqa: E731
    assert [t for _, t in ends(together)] == pytest.approx([t for _, t in ends(apart)], rel=1e-9)


@pytest.mark.parametrize("config", [
    dict(gpu_blocks=20_000),                                       # ample: decode runs, arrivals between them
    dict(gpu_blocks=800, max_running=128),                         # evictions and preemptions
    dict(gpu_blocks=1500, max_prefill_tokens=200, max_running=300),  # the budget runs out inside the batch
    dict(gpu_blocks=2000, block_size=4, cpu_blocks=3000, block_bytes=1e5, instances=2),   # small blocks, CPU tier
])
def test_deferred_decodes_change_no_number(cost, monkeypatch, config):
    """Decodes inside a block are left out of the step loop (serving/engine.py, Engine._defer): every record,
    total and ITL sample is what looking at every request in every step gives."""
    from dataclasses import fields

    from serving.engine import Engine

    def run():
        reqs = preset("multi-turn-chat", 500, 40.0, 3, PresetSizes())
        res = simulate(reqs, cost, ServerConfig(api_server=False, **config))
        return {f.name: getattr(res, f.name) for f in fields(res)}
    deferred = run()
    init = Engine.__init__

    def every_request(self, *args, **kwargs):
        init(self, *args, **kwargs)
        assert self.defers      # the case under test
        self.defers = False
    monkeypatch.setattr(Engine, "__init__", every_request)
    assert run() == deferred
    assert deferred["preemptions"] > 0 or config["gpu_blocks"] != 800


def test_the_simulation_says_how_its_steps_are_priced(capsys):
    """serving_sim carries the step's pricing notes as the optimizer does: the weight formats, and on GPUs without
    peer-to-peer the all-reduce NCCL carries, in the JSON and the text."""
    args = ["llama-3.2-1b", "--device", "h100pcie:no-p2p", "--tp-size", "2", "--workload", "multi-turn-chat",
            "--num-requests", "20"]
    assert main(args + ["--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["pricing_notes"]
    assert any(n.startswith("formats (") for n in notes)
    assert any("no custom all-reduce without peer-to-peer" in n for n in notes)
    assert main(args) == 0
    assert "note: all-reduce on PCIe Gen5 x16 through the host" in capsys.readouterr().out


def test_cache_aware_routing_balances_as_sglangs_gateway_does(cost):
    """A system prompt every request shares is a quarter of each prompt: below the gateway's 0.3 match threshold,
    so requests go where the cache has room. One hot document is most of each prompt: its instance keeps it until
    that instance holds more than 64 requests (and 1.5x) beyond the least loaded; the next goes there, which then
    holds the document too, and equal matches go to the least loaded. The longest match alone had sent every
    request of both to the first instance."""
    cfg = ServerConfig(block_size=16, gpu_blocks=40_000, block_bytes=1, instances=4, routing="cache-aware")
    system = [SimRequest(i, 0.01 * i, 512 + 1536, 4, segments=[("system", 512), (f"u{i}", 1536)]) for i in range(200)]
    assert simulate(system, cost, cfg).instance_requests == [50, 50, 50, 50]
    doc = [SimRequest(i, 0.05 * i, 2048 + 16, 2048, segments=[("doc", 2048), (f"q{i}", 16)]) for i in range(300)]
    res = simulate(doc, cost, cfg)
    assert sum(res.instance_requests) == 300 and max(res.instance_requests) - min(res.instance_requests) <= 65
    assert res.reused_tokens >= (300 - 4) * 2048            # every instance but its first request hits the document
