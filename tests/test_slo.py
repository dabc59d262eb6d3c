"""SLOs as users state them (serving/slo.py): a statistic, headroom, goodput; the optimizer's table and --verify."""
import json

import pytest

from cli.inference.throughput_optimizer import main, overrule
from serving.search import Candidate
from serving.slo import LatencyLimits, goodput_estimate, goodput_of, share_within

Q = {"mean": 22.0, "p50": 20.0, "p90": 40.0, "p99": 80.0}


def test_share_within_passes_through_the_quantiles():
    assert share_within(Q, 20.0) == pytest.approx(0.5)
    assert share_within(Q, 40.0) == pytest.approx(0.9)
    assert share_within(Q, 80.0) == pytest.approx(0.99)
    assert share_within(Q, 1000.0) == 1.0 and share_within(Q, 0.0) == 0.0
    assert share_within(Q, None) == 1.0
    values = [share_within(Q, x) for x in range(0, 130, 5)]
    assert values == sorted(values)
    assert share_within({"mean": 30.0}, 29.0) == 0.0 and share_within({"mean": 30.0}, 31.0) == 1.0


def test_headroom_tightens_each_limit():
    ttft = {"mean": 950.0}
    assert LatencyLimits(1000, None).why_not(ttft, 10.0) == []
    why = LatencyLimits(1000, None, headroom=0.1).why_not(ttft, 10.0)
    assert len(why) == 1 and "900" in why[0] and "10% headroom" in why[0]
    assert LatencyLimits(None, 50, "p99", 0.2).why_not({"p99": 1.0}, 30.0, {"p99": 41.0})[0].startswith("TPOT p99")
    with pytest.raises(ValueError):
        LatencyLimits(1000, None, headroom=1.0)
    with pytest.raises(ValueError):
        LatencyLimits(1000, None, stat="p95")


def test_goodput_counts_requests_within_every_limit():
    limits = LatencyLimits(100, 10)
    assert goodput_of([50, 150, 50, 50], [5, 5, 20, None], 2.0, limits) == pytest.approx(1.0)   # 1st and 4th
    assert goodput_estimate(10.0, {"p50": 1, "p90": 2, "p99": 3}, Q, LatencyLimits(None, 40)) == pytest.approx(9.0)


def _candidate(**kw):
    base = dict(mode="mixed", layout=None, request_rate=1.0, running=1.0, ttft_ms={}, tpot_ms=1.0, e2e_ms={},
                output_tokens_per_s=1.0, total_tokens_per_s=1.0, gpus=1, memory=None, max_num_seqs=1,
                max_batched_tokens=1, kv_tokens=1, limited_by="load", meets_limits=True)
    return Candidate(**{**base, **kw})


def test_a_simulation_that_breaks_a_limit_overrules_the_model():
    c = _candidate()
    overrule(c, {"meets_limits": False, "why_not": ["TPOT mean 51.67 ms > 50 ms"]})
    assert not c.meets_limits and c.why_not == ["simulated TPOT mean 51.67 ms > 50 ms"]
    ok = _candidate()
    overrule(ok, {"meets_limits": True, "why_not": []})
    assert ok.meets_limits and ok.verified["meets_limits"]


BASE = ["llama-3.2-1b", "--device", "h100", "--num-devices", "2", "--input-length", "1024", "--output-length",
        "128", "--tp-sizes", "1,2"]


def run(capsys, *extra):
    assert main([*BASE, *extra, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_headroom_keeps_the_best_below_the_limit(capsys):
    plain = run(capsys, "--ttft-limit", "300", "--tpot-limit", "8", "--limit-stat", "p90")
    kept = run(capsys, "--ttft-limit", "300", "--tpot-limit", "8", "--limit-stat", "p90", "--headroom", "0.2")
    b = kept["best"]
    assert b["ttft_ms"]["p90"] <= 240 + 1e-6 and b["tpot_stats_ms"]["p90"] <= 6.4 + 1e-6
    assert kept["limits"]["headroom"] == 0.2 and kept["limits"]["tpot_target_ms"] == pytest.approx(6.4)
    assert b["request_rate"] < plain["best"]["request_rate"]


def test_goodput_is_a_column_and_an_objective(capsys):
    limits = ["--ttft-limit", "300", "--tpot-limit", "8"]
    by_tokens = run(capsys, *limits)
    by_goodput = run(capsys, *limits, "--objective", "goodput")
    assert all("goodput_requests_per_s" in c for c in by_tokens["candidates"])
    assert by_goodput["objective"] == "goodput"
    assert by_goodput["best"]["goodput_requests_per_s"] >= by_tokens["best"]["goodput_requests_per_s"] - 1e-9
    assert by_goodput["best"]["goodput_requests_per_s"] <= by_goodput["best"]["request_rate"] + 1e-9


def test_goodput_objective_needs_a_limit(capsys):
    assert main([*BASE, "--objective", "goodput"]) == 2
    assert "--objective goodput" in capsys.readouterr().err


def test_verify_covers_disaggregated_layouts_and_the_table_fits(capsys):
    assert main([*BASE, "--mode", "both", "--ttft-limit", "500", "--tpot-limit", "10", "--verify", "6",
                 "--top", "6"]) == 0
    text = capsys.readouterr().out
    assert "simulated (--verify" in text
    assert "p50/p90/p99" in text and "goodput/s" in text and "batch/replica" in text
    assert all(len(line) <= 120 for line in text.splitlines() if not line.startswith("note:"))
    out = run(capsys, "--mode", "both", "--ttft-limit", "500", "--tpot-limit", "10", "--verify", "6", "--top", "6")
    disagg = [c for c in out["candidates"] if c["mode"] == "disagg" and "verified" in c]
    assert disagg, "no disaggregated candidate was simulated"
    v = disagg[0]["verified"]
    assert v["ttft_ms"]["mean"] > 0 and v["tpot_ms"] > 0 and v["output_tokens_per_s"] > 0
    for c in out["candidates"]:
        if "verified" in c and not c["verified"]["meets_limits"]:
            assert not c["meets_limits"]
