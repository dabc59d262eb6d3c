"""Overload is flagged in every CLI (serving/overload.py): offered beyond served, a growing queue, users beyond
the slots."""
import json

from cli.inference import serving_sim, throughput_optimizer
from serving.overload import growing_queue, offered_rate, rate_beyond_served, users_beyond_slots

MOONCAKE = "mooncake:tests/data/mooncake_conversation_300.jsonl"


def test_rules():
    assert rate_beyond_served(2.9, 0.87) and "2.9 requests/s offered, 0.87 served" in rate_beyond_served(2.9, 0.87)
    assert rate_beyond_served(2.9, 2.8) is None
    assert users_beyond_slots(10_000_000, 1024) and users_beyond_slots(1024, 1024) is None
    assert offered_rate([0.0] * 10) is None and offered_rate([0.0, 1.0, 2.0]) == 1.0
    arrivals = [i * 0.1 for i in range(40)]
    assert growing_queue(arrivals, [t + 0.5 * i for i, t in enumerate(arrivals)])          # waits 0 .. 19.5 s
    assert growing_queue(arrivals, [t + 0.01 for t in arrivals]) is None                    # steady, short waits


def _sim(capsys, *extra):
    assert serving_sim.main(["llama-3.1-8b", "--device", "h100", "--workload", MOONCAKE, *extra, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_mooncake_sample_on_one_h100_is_overloaded(capsys):
    out = _sim(capsys)
    messages = [w for w in out["warnings"] if w.startswith("overload")]
    assert any("offered" in w for w in messages) and any("queue grows" in w for w in messages)
    assert all(run["overload"] for run in out["runs"].values())


def test_the_same_trace_slowed_down_is_not(capsys):
    out = _sim(capsys, "--time-scale", "4")
    assert not [w for w in out["warnings"] if w.startswith("overload")]


def _opt(capsys, *extra):
    assert throughput_optimizer.main(["llama-3.2-1b", "--device", "h100", "--num-devices", "1", "--input-length",
                                      "1024", "--output-length", "128", *extra, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_half_a_million_users_do_not_meet_limits(capsys):
    out = _opt(capsys, "--concurrency", "500000")   # more than TRACECOST_MAX_REQUESTS is refused outright
    assert out["best"] == {} and "overload" in out["why_no_feasible_layout"]
    assert all(not c["meets_limits"] and c["overload"] for c in out["candidates"])
    assert any("500,000 concurrent users" in w for w in out["warnings"])


def test_a_rate_beyond_capacity_is_flagged(capsys):
    out = _opt(capsys, "--request-rate", "100000")
    assert all(c["overload"] and not c["meets_limits"] for c in out["candidates"])
    assert any(w.startswith("overload") and "100000 requests/s offered" in w.replace("1e+05", "100000")
               for w in out["warnings"])
