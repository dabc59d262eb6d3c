"""Issue 13: every bad input gets a one-line refusal (exit 2) naming the file, field and rule; nothing hangs."""
import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli.common import MAX_TOKENS
from cli.inference import serving_sim, text_generate
from cli.inference.shapes import load_hit_rate_distribution
from cost.layout_checks import Layout, ModelFacts, check_layout, max_context
from cost.profile import ProfileError, load_profile, parse_profile
from serving.traces import load_jsonl, load_mooncake
from serving.workload import WorkloadError
from cli.inference.config import InputError
from tracer.cli_io import NonFiniteError, dumps_strict
from tracer.config_checks import ConfigError, check_model_config

ROOT = Path(__file__).resolve().parents[1]
H200 = json.loads((ROOT / "hw_profiles" / "h200.json").read_text())
LLAMA_1B = json.loads((ROOT / "tracer" / "configs" / "llama-3.2-1b" / "config.json").read_text())
MIXTRAL = json.loads((ROOT / "tracer" / "configs" / "mixtral-8x7b" / "config.json").read_text())


def run(module, *args, timeout=120, **env):
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env}, timeout=timeout)


def one_line_error(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    return lines[-1]


# --- hardware profiles -------------------------------------------------------------------------------

def _mutated(path: str, value):
    data = copy.deepcopy(H200)
    *parents, last = path.split(".")
    node = data
    for p in parents:
        node = node[p]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value
    return data


@pytest.mark.parametrize("path, value, expected", [
    ("interconnect", "nvlink", "field 'interconnect': must be an object"),
    ("aliases", 5, "field 'aliases': must be a valid list"),
    ("efficiency", 5, "field 'efficiency'"),
    ("efficiency.gemm.compute", "0.7", "field 'efficiency.gemm.compute': must be a valid number"),
    ("efficiency.gemm.compute", 0, "field 'efficiency.gemm.compute': must be greater than 0"),
    ("efficiency.gemm.compute", 1.5, "field 'efficiency.gemm.compute': must be less than or equal to 1"),
    ("efficiency.attention.tile_q", 0, "field 'efficiency.attention.tile_q'"),
    ("efficiency.communication", -0.5, "field 'efficiency.communication'"),
    ("memory.bandwidth_gbps", float("nan"), "field 'memory.bandwidth_gbps': must be a finite number"),
    ("memory.capacity_gb", float("inf"), "field 'memory.capacity_gb': must be a finite number"),
    ("matrix_tflops.bf16", -1, "field 'matrix_tflops.bf16'"),
    ("kernel_launch_us", True, "field 'kernel_launch_us'"),
    ("compute_units", 0, "field 'compute_units'"),
    ("compute_units", 132.5, "field 'compute_units'"),
    ("memory", KeyError, "field 'memory': missing"),
    ("colour", "blue", "field 'colour': unknown field"),
    ("engines", {"tgi": {}}, "field 'engines.tgi': unknown engine"),
    ("engines", {"from": 3}, "field 'engines.from'"),
    ("scale_out", {"name": "IB", "gpus_per_node": 8, "bandwidth_gbps": "fast", "latency_us": 2},
     "field 'scale_out.bandwidth_gbps'"),
    ("scale_out", {"name": "IB", "gpus_per_node": 0, "bandwidth_gbps": 50, "latency_us": 2},
     "field 'scale_out.gpus_per_node'"),
])
def test_profile_schema_names_the_field_and_rule(path, value, expected):
    with pytest.raises(ProfileError) as e:
        parse_profile(_mutated(path, value), "bad", "bad.json")
    assert str(e.value).startswith("bad.json: ") and expected in str(e.value)


def test_profile_accepts_a_scale_out_network():
    scale_out = {"name": "InfiniBand NDR", "gpus_per_node": 4, "bandwidth_gbps": 25, "latency_us": 5.0}
    hw = parse_profile(_mutated("scale_out", scale_out), "ib", "ib.json")
    assert (hw.gpus_per_node, hw.scale_out_bandwidth_gbps, hw.scale_out_latency_us) == (4, 25.0, 5.0)


def test_profile_engine_numbers_are_checked_by_the_parameter_bounds(tmp_path):
    data = copy.deepcopy(H200)
    data["engines"]["vllm"]["gemm"]["bf16"]["compute"] = 7.0
    f = tmp_path / "p.json"
    f.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=r"p.json: engines.vllm.gemm.bf16.compute: 7.0 is outside its physical"):
        load_profile(str(f)).engine("vllm")


def test_non_utf8_and_unreadable_profiles(tmp_path):
    f = tmp_path / "p.json"
    f.write_bytes(b'{"name": "\xff"}')
    r = run("cli.inference.text_generate", "llama-3.2-1b", "--device", str(f))
    assert "not UTF-8" in one_line_error(r)
    r = run("hw_profiles", str(f))
    assert "not UTF-8" in one_line_error(r)


# --- workloads, hit-rate distributions ---------------------------------------------------------------

@pytest.mark.parametrize("line, expected", [
    ('{"arrival_s": NaN, "segments": [{"id": "s", "tokens": 3}], "output_tokens": 2}', "'arrival_s': must be a finite"),
    ('{"arrival_s": 1e300, "segments": [{"id": "s", "tokens": 3}], "output_tokens": 2}', "'arrival_s'"),
    ('{"arrival_s": 0, "segments": [{"id": "s", "tokens": 1000000000000}], "output_tokens": 2}', "segments.0.tokens"),
    ('{"arrival_s": 0, "segments": [{"id": "s", "tokens": 3}], "output_tokens": 2.5}', "'output_tokens'"),
    ('{"arrival_s": "0", "segments": [{"id": "s", "tokens": 3}], "output_tokens": 2}', "'arrival_s'"),
    ('{"arrival_s": 0, "segments": [{"id": "s", "tokens": 3}], "output_tokens": 2, "colour": 1}', "'colour': unknown"),
    ('{"arrival_s": 0, "output_tokens": 2}', "segments or token_ids"),
    ('[1, 2]', "a request line is a JSON object"),
])
def test_workload_lines_are_validated(tmp_path, line, expected):
    f = tmp_path / "w.jsonl"
    f.write_text('{"arrival_s": 0, "segments": [{"id": "s", "tokens": 10}], "output_tokens": 2}\n' + line + "\n")
    with pytest.raises(WorkloadError) as e:
        load_jsonl(f)
    assert str(e.value).startswith(f"{f}:2: ") and expected in str(e.value)


def test_mooncake_lines_are_validated(tmp_path):
    f = tmp_path / "m.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1], "extra": 0}\n')
    with pytest.raises(WorkloadError, match="m.jsonl:1: field 'extra': unknown field"):
        load_mooncake(f)


@pytest.mark.parametrize("text, expected", [
    ("[0.1, NaN]", "entry 1"), ("[0.1, true]", "entry 1"), ("0.2\n\n1.0\n", ":3:"), ("0.2\nabc\n", ":2:"),
    ("[]", "no hit rates"),
])
def test_hit_rate_distribution_is_validated(tmp_path, text, expected):
    f = tmp_path / "rates.txt"
    f.write_text(text)
    with pytest.raises(InputError) as e:
        load_hit_rate_distribution(str(f))
    assert expected in str(e.value)


# --- model configs -----------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value, expected", [
    ("vocab_size", 0, "'vocab_size' must be in [1,"), ("intermediate_size", 0, "'intermediate_size'"),
    ("num_hidden_layers", 0, "'num_hidden_layers'"), ("num_hidden_layers", -1, "'num_hidden_layers'"),
    ("num_hidden_layers", 2.5, "must be an integer"), ("num_key_value_heads", 5, "must divide"),
    ("num_key_value_heads", 64, "must be <="), ("hidden_size", "big", "must be an integer"),
])
def test_config_checks(field, value, expected):
    with pytest.raises(ConfigError) as e:
        check_model_config({**LLAMA_1B, field: value}, "c.json")
    assert str(e.value).startswith("c.json: ") and expected in str(e.value)


@pytest.mark.parametrize("field, value, expected", [
    ("num_local_experts", 0, "'num_local_experts'"), ("num_experts_per_tok", 0, "'num_experts_per_tok'"),
    ("num_experts_per_tok", 9, "must be <= the routed experts"),
])
def test_expert_config_checks(field, value, expected):
    with pytest.raises(ConfigError, match=expected):
        check_model_config({**MIXTRAL, field: value}, "c.json")


def test_a_million_layers_is_refused_fast_with_the_way_to_raise_it(tmp_path):
    f = tmp_path / "config.json"
    f.write_text(json.dumps({**LLAMA_1B, "num_hidden_layers": 10**6}))
    start = time.perf_counter()
    r = run("tracer", str(f), "-q", "8")
    assert time.perf_counter() - start < 30
    assert "TRACECOST_MAX_LAYERS" in one_line_error(r)


def test_zero_sizes_refused_by_text_generate(tmp_path):
    f = tmp_path / "config.json"
    f.write_text(json.dumps({**LLAMA_1B, "vocab_size": 0}))
    assert "vocab_size" in one_line_error(run("cli.inference.text_generate", str(f), "--device", "h200"))


# --- layouts -----------------------------------------------------------------------------------------

def test_layout_rules():
    llama, mixtral = ModelFacts.from_config(LLAMA_1B, "llama"), ModelFacts.from_config(MIXTRAL, "mixtral")
    assert check_layout(llama, Layout(tp=8)) .ok and not check_layout(llama, Layout(tp=8)).warnings
    assert "does not divide" in check_layout(llama, Layout(tp=3)).errors[0]
    assert "does not divide" in check_layout(llama, Layout(tp=64)).errors[0]
    replicated = check_layout(llama, Layout(tp=16))
    assert replicated.ok and "replicated on 2 ranks" in replicated.warnings[0]
    assert "dense model" in check_layout(llama, Layout(ep=8)).errors[0]
    # EP 3 over 8 experts: redundant expert slots (9, 3 per rank), as expert load balancing places them (issue 20)
    uneven = check_layout(mixtral, Layout(ep=3))
    assert uneven.ok and "does not divide" in uneven.warnings[0] and "9 expert slots" in uneven.warnings[0]
    assert "exceeds" in check_layout(mixtral, Layout(ep=16)).errors[0]
    assert check_layout(mixtral, Layout(ep=8, devices=8)).ok
    assert "devices" in check_layout(mixtral, Layout(tp=8, pp=2, devices=8)).errors[0]
    assert "no effect" in check_layout(llama, Layout(), moe_imbalance=2.0).warnings[0]
    assert not check_layout(llama, Layout(), input_length=131072).warnings
    assert "maximum context" in check_layout(llama, Layout(), input_length=131073).warnings[0]


def test_rope_scaling_extends_the_context():
    assert max_context(32768, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}) \
        == 131072
    assert max_context(131072, {"rope_type": "llama3", "factor": 8.0}) == 131072   # already stated
    assert max_context(4096, {"type": "linear", "factor": 2.0}) == 8192
    assert max_context(4096, None) == 4096


def test_layout_warning_reaches_the_json(capsys):
    assert text_generate.main(["llama-3.2-1b", "--device", "h200", "-q", "16", "--tp-size", "16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert any("replicated" in w for w in out["warnings"])


def test_inconsistent_layouts_refused_by_the_clis():
    r = run("cli.inference.text_generate", "llama-3.2-1b", "--device", "h200", "--tp-size", "3")
    assert "TP=3" in one_line_error(r)
    r = run("cli.inference.serving_sim", "llama-3.2-1b", "--device", "h200", "--workload", "random", "--tp-size", "5")
    assert "TP=5" in one_line_error(r)


# --- bounded work, strict JSON, quiet pipes, help ----------------------------------------------------

def test_huge_lengths_refused_with_the_way_to_raise_them():
    r = run("cli.inference.text_generate", "llama-3.2-1b", "--device", "h200", "-q", str(10**12))
    assert MAX_TOKENS.env in one_line_error(r)
    r = run("cli.inference.serving_sim", "llama-3.2-1b", "--device", "h200", "--workload", "random",
            "--num-requests", "1e12")
    assert "TRACECOST_MAX_REQUESTS" in one_line_error(r)
    r = run("cli.inference.serving_sim", "llama-3.2-1b", "--device", "h200", "--workload", "random",
            "--max-prefill-tokens", "1", "--input-tokens", "100000", "--num-requests", "100")
    assert "TRACECOST_MAX_SIM_STEPS" in one_line_error(r)


def test_limits_can_be_raised(capsys, monkeypatch):
    monkeypatch.setenv(MAX_TOKENS.env, "10")
    assert text_generate.main(["llama-3.2-1b", "--device", "h200", "-q", "16"]) == 2
    assert MAX_TOKENS.env in capsys.readouterr().err


def test_plot_into_a_missing_folder_or_without_a_sweep(tmp_path):
    r = run("cli.inference.text_generate", "llama-3.2-1b", "--device", "h200", "--sweep-prefix-cache-hit-rate",
            "0,0.5", "--plot", str(tmp_path / "no" / "x.png"))
    assert "does not exist" in one_line_error(r)
    r = run("cli.inference.text_generate", "llama-3.2-1b", "--device", "h200", "--plot", str(tmp_path / "x.png"))
    assert "--sweep-prefix-cache-hit-rate" in one_line_error(r)
    r = run("cli.inference.serving_sim", "llama-3.2-1b", "--device", "h200", "--workload", "random",
            "--plot", str(tmp_path / "no" / "x.png"))
    assert "does not exist" in one_line_error(r)


def test_strict_json():
    assert json.loads(dumps_strict({"limit": float("inf"), "x": [1.5]})) == {"limit": None, "x": [1.5]}
    with pytest.raises(NonFiniteError, match=r"\$.a\[0\]"):
        dumps_strict({"a": [float("nan")]})


@pytest.mark.parametrize("module, args", [
    ("tracer", ["--list"]), ("hw_profiles", []), ("cli.inference.text_generate", ["--help"]),
])
def test_broken_pipe_exits_quietly(module, args):
    p = subprocess.Popen([sys.executable, "-m", module, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    p.stdout.close()   # the reader is gone before the first line
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) in (0, 141) and "Traceback" not in err and "BrokenPipe" not in err


def _parsers(main, argv):
    """Every argparse parser a CLI's main builds."""
    import argparse
    seen = []

    def capture(self, args=None, namespace=None):
        seen.append(self)
        raise SystemExit(0)
    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = capture
    try:
        with pytest.raises(SystemExit):
            main(argv)
    finally:
        argparse.ArgumentParser.parse_args = original
    return seen


def test_every_flag_has_help():
    from cost import calibrate, kernel
    from tracer import __main__ as tracer_cli
    missing = []
    for main in (text_generate.main, serving_sim.main, tracer_cli.main, calibrate.main, kernel.main):
        for parser in _parsers(main, []):
            for action in parser._actions:
                if not action.help and action.dest != "help":
                    missing.append(f"{parser.prog} {action.option_strings or action.dest}")
    assert not missing
