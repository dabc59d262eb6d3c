"""Cost in dollars (serving/dollars.py): --gpu-hour-price or the profile's price, in the optimizer, the simulator
and the Pareto plot."""
import json
from pathlib import Path

import pytest

from cli.inference import serving_sim, throughput_optimizer
from cli.inference.pareto import ParetoPoint, plot, usd_per_million
from cost.profile import ProfileError, load_profile
from serving.dollars import GpuPrice, gpu_price

ROOT = Path(__file__).resolve().parents[1]


def test_dollars_per_million_tokens():
    d = GpuPrice(4.0, "test").of(8, 2016.0, 2016.0 * 9)
    assert d["usd_per_hour"] == 32.0
    assert d["usd_per_million_output_tokens"] == pytest.approx(32 / (2016 * 3600) * 1e6)
    assert d["usd_per_million_total_tokens"] == pytest.approx(d["usd_per_million_output_tokens"] / 9)
    assert GpuPrice(4.0, "test").of(8, 0.0, 0.0)["usd_per_million_output_tokens"] is None


def test_profiles_carry_a_dated_price_the_user_overrides():
    hw = load_profile("h100")
    assert hw.gpu_hour_usd > 0 and "20" in hw.price_origin and "http" in hw.price_origin
    assert gpu_price(hw).usd_per_gpu_hour == hw.gpu_hour_usd
    assert gpu_price(hw, 1.25).usd_per_gpu_hour == 1.25 and gpu_price(hw, 1.25).origin == "--gpu-hour-price"
    assert gpu_price(load_profile("l40s")) is None


def test_a_bad_price_is_refused(tmp_path):
    data = json.loads((ROOT / "hw_profiles" / "h100.json").read_text())
    data["price"] = {"gpu_hour_usd": -1, "source": "x", "date": "2026"}
    data.pop("engines", None)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="price.gpu_hour_usd"):
        load_profile(str(path))


def _opt(capsys, *extra):
    assert throughput_optimizer.main(["llama-3.2-1b", "--device", "h100", "--num-devices", "2", "--input-length",
                                      "512", "--output-length", "128", *extra, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_optimizer_prices_every_candidate(capsys):
    out = _opt(capsys, "--gpu-hour-price", "2")
    assert out["price"]["usd_per_gpu_hour"] == 2.0
    for c in out["candidates"]:
        if c["output_tokens_per_s"] > 0:
            assert c["dollars"]["usd_per_hour"] == 2.0 * c["gpus"]
            assert c["dollars"]["usd_per_million_output_tokens"] == pytest.approx(
                2.0 / (c["output_tokens_per_s_per_gpu"] * 3600) * 1e6)
    default = _opt(capsys)
    assert default["price"]["usd_per_gpu_hour"] == load_profile("h100").gpu_hour_usd


def test_no_price_says_so(capsys):
    assert throughput_optimizer.main(["llama-3.2-1b", "--device", "l40s", "--num-devices", "1", "--input-length",
                                      "512", "--output-length", "64"]) == 0
    assert "no dollars" in capsys.readouterr().out


def test_simulator_prices_its_runs(capsys):
    assert serving_sim.main(["llama-3.2-1b", "--device", "h100", "--workload", "random", "--num-requests", "40",
                             "--gpu-hour-price", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    run = next(iter(out["runs"].values()))
    assert run["dollars"]["usd_per_hour"] == 3.0
    assert run["dollars"]["usd_per_million_output_tokens"] == pytest.approx(
        3.0 / (run["output_tokens_per_s"] * 3600) * 1e6)


def test_pareto_plot_has_a_cost_panel(tmp_path):
    pytest.importorskip("matplotlib")
    points = [ParetoPoint("mixed TP1 DP2", "mixed", 1000.0, 100.0, 20.0),
              ParetoPoint("mixed TP2 DP1", "mixed", 400.0, 50.0, 8.0)]
    assert usd_per_million(points[0], 3.6) == pytest.approx(1.0)
    path = tmp_path / "p.png"
    assert plot(points, path, usd_per_gpu_hour=3.0) and path.stat().st_size > 0
