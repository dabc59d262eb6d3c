"""The disaggregated simulator (serving/disagg_sim.py): prefill and decode pools, KV transfer, own queues."""
import random

import pytest

from cost.profile import load_profile
from serving.disagg_sim import DisaggConfig, simulate_disagg
from serving.simulator import ServerConfig
from serving.step_cost import StepCost
from serving.workload import SimRequest, arrival_times
from tracer.model_source import resolve_model
from tracer.work import TraceOptions

KV_PER_TOKEN = 32768.0     # llama-3.2-1b: 16 layers x 8 KV heads x 64 x 2 (K, V) x 2 bytes


@pytest.fixture(scope="module")
def cost():
    return StepCost(resolve_model("llama-3.2-1b"), load_profile("h100"), TraceOptions(), "engine", 1, "vllm")


def requests(n, rate, prompt=512, output=64, seed=0):
    times = arrival_times(n, rate, random.Random(seed), "poisson")
    return [SimRequest(i, t, prompt, output) for i, t in enumerate(times)]


def config(prefill=1, decode=1, running=256, link=400e9, kv_tokens=10**6):
    return DisaggConfig(ServerConfig(gpu_blocks=kv_tokens // 16, max_prefill_tokens=8192, prefix_caching=False,
                                     instances=prefill), decode, running, kv_tokens, KV_PER_TOKEN, link)


def test_every_request_finishes_with_its_tokens(cost):
    res = simulate_disagg(requests(200, 20.0), cost, cost, config(prefill=2, decode=2))
    assert len(res.records) == 200 and not res.rejected_ids
    for r in res.records:
        assert r.arrival_s <= r.prefill_done_s <= r.first_token_s <= r.decode_admit_s <= r.finish_s
        assert r.tpot_s > 0
    assert res.output_tokens_per_s == pytest.approx(200 * 64 / res.makespan_s)


def test_at_low_load_ttft_is_prefill_plus_transfer(cost):
    res = simulate_disagg(requests(20, 0.5), cost, cost, config(link=1e9))
    transfer = 512 * KV_PER_TOKEN / 1e9
    prefill = cost.step([(512, 0)], 0, 0)
    outside = cost.overheads.request_ms * 1e-3
    for r in res.records:
        assert r.ttft_s == pytest.approx(prefill + transfer + outside, rel=0.02)
        assert r.transfer_wait_s == pytest.approx(transfer, rel=1e-6)


def test_a_slow_link_queues_transfers(cost):
    # each transfer takes 0.17 s on a 0.1 GB/s link; 20 requests/s arrive: the link's queue grows
    res = simulate_disagg(requests(60, 20.0), cost, cost, config(link=1e8))
    waits = [r.transfer_wait_s for r in sorted(res.records, key=lambda r: r.arrival_s)]
    assert waits[-1] > 10 * waits[0]


def test_decode_slots_queue_requests(cost):
    few = simulate_disagg(requests(100, 50.0), cost, cost, config(running=2))
    many = simulate_disagg(requests(100, 50.0), cost, cost, config(running=256))
    wait = lambda res: max(r.decode_admit_s - r.first_token_s for r in res.records)  # noqa: E731
    assert wait(few) > 1.0 and wait(many) == pytest.approx(0.0, abs=0.05)
    assert few.makespan_s > many.makespan_s


def test_serving_sim_has_a_disaggregated_mode(capsys):
    import json
    from cli.inference import serving_sim
    assert serving_sim.main(["llama-3.2-1b", "--device", "h100", "--workload", "random", "--num-requests", "60",
                             "--request-rate", "20", "--disagg", "1:2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    d = out["disaggregated"]
    assert d["prefill_instances"] == 1 and d["decode_instances"] == 2 and d["gpus"] == 3
    assert d["run"]["completed_requests"] == 60 and d["run"]["ttft_ms"]["p50"] > 0
    assert d["run"]["dollars"]["usd_per_hour"] == pytest.approx(3 * load_profile("h100").gpu_hour_usd)


@pytest.mark.parametrize("extra", [["--disagg", "2"], ["--disagg", "0:1"], ["--disagg", "1:1", "--compare"],
                                   ["--disagg", "1:1", "--concurrency", "4"]])
def test_serving_sim_refuses_bad_pools(capsys, extra):
    from cli.inference import serving_sim
    with pytest.raises(SystemExit) as e:
        serving_sim.main(["llama-3.2-1b", "--device", "h100", "--workload", "random", *extra])
    assert e.value.code == 2 and "--disagg" in capsys.readouterr().err


def test_prefill_instances_hit_the_prefix_cache(cost):
    def shared(n):
        out = []
        for i in range(n):
            r = SimRequest(i, i * 0.2, 2048, 8, segments=[("system", 1536), (f"user-{i}", 512)])
            r.hash_blocks(16)
            out.append(r)
        return out
    cold = simulate_disagg(shared(20), cost, cost, config())
    base = config()
    warm_cfg = DisaggConfig(ServerConfig(gpu_blocks=base.prefill.gpu_blocks, max_prefill_tokens=8192,
                                         prefix_caching=True), 1, 256, base.decode_kv_tokens, KV_PER_TOKEN,
                            base.link_bytes_per_s)
    warm = simulate_disagg(shared(20), cost, cost, warm_cfg)
    prefill = lambda res: sorted(r.prefill_done_s - r.arrival_s for r in res.records)[10]  # noqa: E731
    assert prefill(warm) < 0.6 * prefill(cold)     # 512 of 2048 tokens computed once the system prompt is cached
