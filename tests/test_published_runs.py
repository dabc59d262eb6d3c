"""Published rows as tracecost prices them: a stated prefix-cache hit is served from the cache, and an overhead
fit cannot drop the rows its candidate parameters refuse."""
import math

import pytest

from cost.engines import ServingOverheads
from serving.calibrate_overheads import LOSS_CAP, loss
from serving.published import Predictor, map_row

ROW = {"id": "test-burst", "source_kind": "test", "model": "Qwen/Qwen3-8B", "gpu": "H100-SXM-80GB",
       "engine": "vLLM", "engine_version": "v0.11.0", "precision": "bf16", "tp": 1, "isl": 1024, "osl": 128,
       "mode": "online_request_rate", "num_requests": 100, "output_tok_s": 1000.0,
       "ttft_ms": {"mean": 500.0}, "tpot_ms": {"mean": 30.0}, "engine_flags": "vllm serve Qwen/Qwen3-8B"}


@pytest.mark.parametrize("stated, rate", [(None, 0.0), ({"enabled": True, "hit_rate": None}, 0.0),
                                          ({"enabled": True, "hit_rate": 0.5}, 0.5),
                                          ({"enabled": True, "hit_rate": "~1.0 (stated: all prompts hit)"}, 1.0),
                                          ({"enabled": False, "hit_rate": 0.9}, 0.0)])
def test_the_stated_hit_rate_is_read(stated, rate):
    run, why = map_row({**ROW, "prefix_cache": stated})
    assert why is None and run.prefix_hit_rate == rate


def test_a_full_hit_serves_whole_blocks_and_recomputes_the_last_token():
    predictor = Predictor()
    offline = {**ROW, "engine_flags": None}     # no HTTP server: the burst's TTFT is its prefill, not the intake
    cold, _ = map_row(offline)
    hot, _ = map_row({**offline, "prefix_cache": {"enabled": True, "hit_rate": "~1.0"}})
    assert cold.api_servers == 0
    cost = predictor.cost(hot)
    assert cost.defaults.cache_block_tokens == 16                   # vLLM's KV block
    assert predictor.cached_tokens(hot, cost) == 1008                # 1023 tokens, whole blocks of 16
    assert predictor.cached_tokens(cold, cost) == 0
    cold_pred, hot_pred = predictor.predict(cold)[0], predictor.predict(hot)[0]
    assert hot_pred["ttft_ms"] < cold_pred["ttft_ms"] / 2            # 16 of 1024 prompt tokens are prefilled
    assert hot_pred["output_tok_s"] > cold_pred["output_tok_s"]


class _Pool:
    """Stands in for a PredictorPool: one run priced, one refused."""
    def __init__(self, refused):
        self.refused = refused

    def map(self, runs, params):
        return [(r, None if r.id in self.refused else dict(r.measured), None) for r in runs]


def test_a_refused_run_counts_at_the_cap_in_the_fit_loss():
    runs = [map_row({**ROW, "id": i})[0] for i in ("a", "b")]
    assert loss(runs, _Pool(set()), ServingOverheads()) == 0.0       # exact predictions
    # one of two runs refused: every metric's mean is half the cap (refusing cannot lower the loss)
    assert math.isclose(loss(runs, _Pool({"b"}), ServingOverheads()), LOSS_CAP / 2)


def test_each_engine_divides_memory_its_own_way():
    """vLLM's budget holds the profile forward's activations and its non-torch reserve; SGLang's
    mem_fraction_static holds only weights and the KV pool. Qwen3-32B in bf16 on one A100 80GB then has room for
    its 40960-token max_model_len under vLLM, as the published run that started with it shows."""
    from cost.estimate import Parallelism
    from cost.profile import load_profile
    from serving.step_cost import StepCost
    from tracer import TraceOptions, resolve_model
    spec, hw = resolve_model("qwen3-32b"), load_profile("a100")
    vllm, sglang = (StepCost(spec, hw, TraceOptions(), "engine", Parallelism(1), e) for e in ("vllm", "sglang"))
    v = vllm.replica_memory(vllm.defaults.max_batched_tokens)
    s = sglang.replica_memory(sglang.defaults.max_batched_tokens)
    assert v.activations > 0 and v.reserve == pytest.approx(0.5e9)
    assert v.kv_cache == pytest.approx(0.9 * hw.memory_bytes - v.weights - v.activations - v.reserve)
    assert s.kv_cache == pytest.approx(0.88 * hw.memory_bytes - s.weights)      # activations beyond the fraction
    assert v.kv_tokens >= 40960
