"""The Pareto frontier of serving setups (cli/inference/pareto.py) on hand-made points."""
import random
import sys

import pytest

from cli.inference.pareto import DISAGG, MIXED, ParetoPoint, by_hit_rate, frontier, plot


def point(label, gpu, tpot, mode=MIXED, feasible=True, hit_rate=None):
    return ParetoPoint(label, mode, gpu, ttft_ms=100.0, tpot_ms=tpot, feasible=feasible, hit_rate=hit_rate)


def test_frontier_by_hand():
    pts = [point("a", 1000, 50),    # 20 tok/s/user, most per GPU
           point("b", 600, 20),     # 50 tok/s/user
           point("c", 500, 25),     # 40 tok/s/user: beaten by b on both
           point("d", 200, 10, DISAGG),  # 100 tok/s/user
           point("e", 2000, 5, feasible=False),  # would dominate all, but breaks a limit
           point("f", 600, 20, DISAGG)]          # same spot as b: neither beats the other
    assert [p.label for p in frontier(pts)] == ["a", "b", "f", "d"] or \
        [p.label for p in frontier(pts)] == ["a", "f", "b", "d"]
    assert point("x", 100, 20).tokens_per_s_per_user == 50.0
    assert frontier([point("e", 1, 1, feasible=False)]) == []


def test_frontier_matches_brute_force():
    rng = random.Random(7)
    pts = [point(str(i), rng.choice([100, 200, 300]) * rng.random(), rng.choice([5, 10, 20, 40]),
                 rng.choice([MIXED, DISAGG]), rng.random() > 0.2) for i in range(300)]
    feasible = [p for p in pts if p.feasible]

    def dominated(q):
        return any(p.tokens_per_s_per_gpu >= q.tokens_per_s_per_gpu and p.tokens_per_s_per_user >=
                   q.tokens_per_s_per_user and (p.tokens_per_s_per_gpu, p.tpot_ms) != (q.tokens_per_s_per_gpu, q.tpot_ms)
                   for p in feasible)
    expected = {p.label for p in feasible if not dominated(p)}
    got = frontier(pts)
    assert {p.label for p in got} == expected
    users = [p.tokens_per_s_per_user for p in got]
    assert users == sorted(users)


def test_points_refuse_bad_values():
    with pytest.raises(ValueError, match="mode"):
        point("x", 1, 1, mode="both")
    with pytest.raises(ValueError, match="finite"):
        point("x", float("nan"), 1)
    with pytest.raises(ValueError, match="tpot_ms"):
        point("x", 1, 0)
    assert point("x", 1, 4).as_json()["tokens_per_s_per_user"] == 250.0


def test_grouped_by_hit_rate():
    groups = by_hit_rate([point("a", 1, 1, hit_rate=0.5), point("b", 1, 1), point("c", 1, 1, hit_rate=0.0)])
    assert list(groups) == [None, 0.0, 0.5]


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    pts = [point("a", 1000, 50), point("b", 600, 20, DISAGG), point("c", 900, 40, hit_rate=None),
           point("d", 100, 10, feasible=False)]
    out = tmp_path / "pareto.png"
    assert plot(pts, out, ttft_limit_ms=500, tpot_limit_ms=30, title="test") is True
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with_rates = tmp_path / "rates.png"
    assert plot([point("a", 10, 5, hit_rate=0.0), point("b", 20, 5, hit_rate=0.5)], with_rates) is True
    assert with_rates.stat().st_size > 1000
    with pytest.raises(ValueError, match="does not exist"):
        plot(pts, tmp_path / "missing" / "p.png")


def test_plot_without_matplotlib_warns_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)   # import fails as if not installed
    assert plot([point("a", 1, 1)], tmp_path / "p.png") is False
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "matplotlib" in err
    assert not (tmp_path / "p.png").exists()
