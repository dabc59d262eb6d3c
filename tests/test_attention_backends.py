"""An engine's other attention backend fitted apart (SGLang's Triton kernels beside FlashInfer, FA3 or trtllm_mha in
its tables), and an attention with sink logits priced on it where the engine runs it there."""
import pytest

from cost.estimate import estimate
from cost.kernel_db import _attention
from cost.kernel_rows import AttentionRow, RowError, group_key, parse_row, price_rows_traced
from cost.profile import load_profile
from tracer.trace import trace
from tracer.work import Request


def _table(sources):
    n = len(sources)
    return {"latency": [0.01] * n, "kernel_source": sources, "kv_cache_dtype": ["bfloat16"] * n,
            "batch_size": [1] * n, "num_heads": [64] * n, "num_key_value_heads": [8] * n, "head_dim": [64] * n,
            "isl": [128] * n, "step": [128] * n, "window_size": [0, 128] + [0] * (n - 2)}


def test_the_tables_triton_rows_are_their_own_backend_where_another_backend_is_timed_too():
    rows, _ = _attention(_table(["triton", "triton", "flashinfer"]), "prefill", True, apart=("triton",))
    assert [r.backend for r in rows] == ["triton", "triton", ""]
    assert group_key(rows[0]) == ("attention", "prefill", "bf16_triton")
    assert group_key(rows[1]) == ("attention", "prefill", "bf16_window_triton")
    decode, _ = _attention(_table(["triton", "triton", "flashinfer"]), "decode", True, apart=("triton",))
    assert group_key(decode[0]) == ("attention", "decode", "bf16_triton")
    # a table of one backend keeps its rows on the plain models (A100's SGLang 0.5.10 tables)
    alone, _ = _attention(_table(["triton", "triton"]), "prefill", True, apart=("triton",))
    assert {r.backend for r in alone} == {""}


def test_a_row_names_its_backend():
    row = parse_row({"op": "attention", "phase": "decode", "batch": 8, "query": 1, "context": 1024, "heads": 64,
                     "kv_heads": 8, "head_dim": 64, "backend": "triton"}, 1)
    assert row.backend == "triton"
    with pytest.raises(RowError, match="backend"):
        parse_row({"op": "attention", "phase": "decode", "batch": 8, "query": 1, "context": 1024, "heads": 64,
                   "kv_heads": 8, "head_dim": 64, "backend": "fa9"}, 2)


@pytest.mark.parametrize("device", ["l40s", "rtxpro6000"])
def test_sglang_prices_triton_rows_on_their_own_models_off_hopper(device):
    hw = load_profile(device)
    cal = hw.engine("sglang")
    assert {"bf16_triton", "fp8_triton"} <= set(cal.prefill_attention) and "bf16_triton" in cal.decode_attention
    rows = [AttentionRow("decode", 64, 1, 4096, 64, 8, 64, backend=b) for b in ("triton", "")]
    seconds, models = price_rows_traced(cal, hw, rows)
    assert models[0] == "decode_attention.bf16_triton" and models[1] in ("decode_attention.bf16",
                                                                       "decode_attention.bf16_tc")
    assert seconds[0] != pytest.approx(seconds[1], rel=0.02)


def test_gpt_oss_attention_runs_on_sglangs_triton_backend_off_hopper_and_says_so():
    t = trace("gpt-oss-20b", Request(8, 1, 4096))
    e = estimate(t, load_profile("l40s"), engine="sglang")
    assert any("sink logits on its Triton backend" in n and "own kernel models" in n for n in e.notes), e.notes
    # on Hopper SGLang runs gpt-oss on FA3, its default backend's fit
    h100 = estimate(t, load_profile("h100"), engine="sglang")
    assert not any("Triton backend" in n for n in h100.notes)


def test_a_chunk_the_backend_does_not_run_by_chunks_is_a_full_attention_row():
    # SGLang's collector sets Llama-4's attention chunk (8192) as the row's window; only FA3 runs it by chunks
    t = _table(["triton", "fa3", "triton", "triton"])
    t["window_size"] = [8192, 8192, 128, 0]
    rows, _ = _attention(t, "prefill", True, chunk_windows=(8192,), chunk_backends=("fa3",))
    assert [r.window for r in rows] == [0, 8192, 128, 0]
    # without the collector's word a window is a window
    plain, _ = _attention(t, "prefill", True)
    assert [r.window for r in plain] == [8192, 8192, 128, 0]


def test_sglangs_collector_names_llama4s_chunk_and_the_backend_that_runs_it():
    from cost.kernel_db import COLLECTORS
    sglang = COLLECTORS["sglang"]
    assert sglang.chunk_windows == (8192,) and sglang.chunk_backends == ("fa3",)
    assert COLLECTORS["vllm"].chunk_windows == () and COLLECTORS["trtllm"].chunk_windows == ()
