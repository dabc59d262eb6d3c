"""Serving layouts as engine launch commands (cli/inference/launch_commands.py): the documented flags."""
import json
import re
import shlex

import pytest
import yaml

from cli.inference.launch_commands import Disaggregation, Role, ServingLayout, launch_command

LAYOUT = ServingLayout("meta-llama/Llama-3.1-8B", tp=2, pp=1, dp=2, max_num_seqs=128, max_batched_tokens=4096,
                       prefix_caching=True, memory_utilization=0.85, kv_cache_dtype="fp8")
DISAGG = ServingLayout("meta-llama/Llama-3.1-8B", max_num_seqs=64, port=9000,
                       disaggregated=Disaggregation(Role(instances=1, tp=2, max_num_seqs=8),
                                                    Role(instances=2, tp=1, max_num_seqs=512)))


def commands(script: str, program: str) -> list[list[str]]:
    """Each command line of the script that runs `program`, as argv words (environment assignments dropped)."""
    body = re.sub(r"<<'EOF'\n.*?\nEOF", "", script, flags=re.S).replace("\\\n", " ")
    out = []
    for line in body.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        words = [w for w in shlex.split(line.rstrip(" &")) if not re.match(r"^[A-Z_]+=", w)]
        if " ".join(words).startswith(program):
            out.append(words)
    return out


def flag(words: list[str], name: str) -> str:
    return words[words.index(name) + 1]


def yaml_files(script: str) -> dict[str, dict]:
    return {m.group(1): yaml.safe_load(m.group(2)) for m in re.finditer(r"cat > (\S+) <<'EOF'\n(.*?)EOF", script, re.S)}


def test_vllm_flags():
    [cmd] = commands(launch_command(LAYOUT, "vllm"), "vllm serve")
    assert cmd[2] == "meta-llama/Llama-3.1-8B"
    assert (flag(cmd, "--tensor-parallel-size"), flag(cmd, "--data-parallel-size")) == ("2", "2")
    assert (flag(cmd, "--max-num-seqs"), flag(cmd, "--max-num-batched-tokens")) == ("128", "4096")
    assert (flag(cmd, "--gpu-memory-utilization"), flag(cmd, "--kv-cache-dtype")) == ("0.85", "fp8")
    assert "--enable-prefix-caching" in cmd and "--enable-expert-parallel" not in cmd
    off = commands(launch_command(ServingLayout("m/x"), "vllm"), "vllm serve")[0]
    assert "--no-enable-prefix-caching" in off and "--data-parallel-size" not in off


def test_vllm_moe_replicas_stay_apart_unless_ep_spans_them():
    per_replica = commands(launch_command(ServingLayout("m/moe", tp=2, dp=2, ep=2, moe=True), "vllm"), "vllm serve")
    assert len(per_replica) == 2 and all("--enable-expert-parallel" in c and "--data-parallel-size" not in c
                                         for c in per_replica)
    [wide] = commands(launch_command(ServingLayout("m/moe", tp=1, dp=8, ep=8, moe=True), "vllm"), "vllm serve")
    assert flag(wide, "--data-parallel-size") == "8" and "--enable-expert-parallel" in wide


def test_sglang_flags():
    [cmd] = commands(launch_command(LAYOUT, "sglang"), "python -m sglang.launch_server")
    assert flag(cmd, "--model-path") == "meta-llama/Llama-3.1-8B"
    assert (flag(cmd, "--tp-size"), flag(cmd, "--dp-size")) == ("2", "2")
    assert (flag(cmd, "--max-running-requests"), flag(cmd, "--chunked-prefill-size")) == ("128", "4096")
    assert (flag(cmd, "--mem-fraction-static"), flag(cmd, "--kv-cache-dtype")) == ("0.85", "fp8_e4m3")
    assert "--disable-radix-cache" not in cmd
    [off] = commands(launch_command(ServingLayout("m/x", ep=4, tp=4, moe=True), "sglang"), "python -m sglang")
    assert "--disable-radix-cache" in off and flag(off, "--ep-size") == "4"


def test_trtllm_flags_and_options_file():
    script = launch_command(LAYOUT, "trtllm")
    cmds = commands(script, "trtllm-serve")
    assert len(cmds) == 2   # no DP flag: one process per replica
    for cmd, gpus_port in zip(cmds, ("8001", "8002")):
        assert cmd[1] == "meta-llama/Llama-3.1-8B" and flag(cmd, "--port") == gpus_port
        assert (flag(cmd, "--tp_size"), flag(cmd, "--pp_size")) == ("2", "1")
        assert (flag(cmd, "--max_batch_size"), flag(cmd, "--max_num_tokens")) == ("128", "4096")
        options = yaml_files(script)[flag(cmd, "--extra_llm_api_options")]
        assert options["kv_cache_config"] == {"enable_block_reuse": True, "dtype": "fp8"}
    assert "CUDA_VISIBLE_DEVICES=2,3" in script and "share of the memory left after the weights" in script
    exact = launch_command(ServingLayout("m/x", memory_utilization=0.9, device_memory_gb=100, weights_gb_per_gpu=40),
                           "trtllm")
    assert flag(commands(exact, "trtllm-serve")[0], "--kv_cache_free_gpu_memory_fraction") == "0.833"  # 50 / 60


def test_disaggregated_instances_for_every_engine():
    vllm = launch_command(DISAGG, "vllm")
    cmds = commands(vllm, "vllm serve")
    assert [flag(c, "--tensor-parallel-size") for c in cmds] == ["2", "1", "1"]
    assert [flag(c, "--max-num-seqs") for c in cmds] == ["8", "512", "512"]
    assert all("NixlConnector" in flag(c, "--kv-transfer-config") for c in cmds)
    assert "# fill in:" in vllm

    sglang = launch_command(DISAGG, "sglang")
    servers = commands(sglang, "python -m sglang.launch_server")
    assert [flag(c, "--disaggregation-mode") for c in servers] == ["prefill", "decode", "decode"]
    [router] = commands(sglang, "python -m sglang_router.launch_router")
    assert "--pd-disaggregation" in router and flag(router, "--prefill") == "http://127.0.0.1:9001"
    assert flag(router, "--port") == "9000" and "# fill in:" in sglang

    trt = launch_command(DISAGG, "trtllm")
    files = yaml_files(trt)
    assert files["tracecost-trtllm-ctx.yaml"]["disable_overlap_scheduler"] is True
    assert "cache_transceiver_config" in files["tracecost-trtllm-gen.yaml"]
    disagg = files["tracecost-trtllm-disagg.yaml"]
    assert disagg["context_servers"] == {"num_instances": 1, "urls": ["127.0.0.1:9001"]}
    assert disagg["generation_servers"]["urls"] == ["127.0.0.1:9002", "127.0.0.1:9003"]
    assert ["trtllm-serve", "disaggregated", "-c", "tracecost-trtllm-disagg.yaml"] in commands(trt, "trtllm-serve")


def test_vllm_gets_a_max_model_len_only_where_its_kv_cache_is_short(capsys):
    """vLLM refuses to start without KV room for one max_model_len sequence (the model's 131072 for Llama-3.1):
    the launch line carries --max-model-len where the priced cache holds less, as the optimizer emits it."""
    from cli.inference.throughput_optimizer import main
    [short] = commands(launch_command(ServingLayout("m/x", max_model_len=3072), "vllm"), "vllm serve")
    assert flag(short, "--max-model-len") == "3072"
    assert "--max-model-len" not in commands(launch_command(LAYOUT, "vllm"), "vllm serve")[0]
    args = ["llama-3.1-8b", "--num-devices", "1", "--input-length", "2048", "--output-length", "512",
            "--emit", "vllm"]
    assert main([*args, "--device", "l4"]) == 0               # 24 GB: about 49k tokens of KV
    assert "--max-model-len 3072" in capsys.readouterr().out   # 2560 tokens asked, rounded up to 1024
    assert main([*args, "--device", "h100"]) == 0
    assert "--max-model-len" not in capsys.readouterr().out


def test_an_engine_the_device_cannot_run_is_not_emitted(capsys):
    """--emit trtllm on MI300X printed a trtllm-serve line for AMD GPUs, though --engine trtllm is refused there;
    an emitted engine other than the priced one says its speeds are another engine's."""
    from cli.inference.throughput_optimizer import main
    args = ["llama-3.1-8b", "--num-devices", "1", "--input-length", "1024", "--output-length", "128"]
    assert main([*args, "--device", "mi300x", "--emit", "trtllm"]) == 2
    out = capsys.readouterr()
    assert "trtllm-serve" not in out.out and "TensorRT-LLM runs on NVIDIA GPUs only" in out.err
    assert main([*args, "--device", "h100", "--emit", "sglang", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert "sglang" in result["launch_command"] and any(
        w.startswith("--emit sglang: the layout is ranked with vLLM's") for w in result["warnings"])


def test_bad_layouts_are_refused():
    with pytest.raises(ValueError, match="ep must be"):
        ServingLayout("m/x", tp=2, dp=2, ep=3)
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        ServingLayout("m/x", kv_cache_dtype="int4")
    with pytest.raises(ValueError, match="memory_utilization"):
        ServingLayout("m/x", memory_utilization=1.5)
    with pytest.raises(ValueError, match="max_model_len"):
        ServingLayout("m/x", max_model_len=0)
    with pytest.raises(ValueError, match="unknown engine"):
        launch_command(LAYOUT, "tgi")


def test_speculative_flags_per_engine():
    """The optimizer's winning draft goes into the launch line, in each engine's own spelling."""
    import json
    from dataclasses import replace
    from cli.inference.launch_commands import EAGLE3_HEAD
    from serving.speculative import Speculation

    def searched(method, k, topk=1, draft_tokens=0, draft_model=None):   # a draft as the optimizer searched it
        return Speculation(method, k, (0.6,), "test", draft_model, topk, draft_tokens)
    eagle = replace(LAYOUT, speculative=searched("eagle3", 3))
    [cmd] = commands(launch_command(eagle, "vllm"), "vllm serve")
    assert json.loads(flag(cmd, "--speculative-config")) == {"method": "eagle3", "model": EAGLE3_HEAD,
                                                             "num_speculative_tokens": 3}
    assert f"# fill in: {EAGLE3_HEAD}" in launch_command(eagle, "vllm")
    mtp = replace(LAYOUT, speculative=searched("mtp", 2))
    assert json.loads(flag(commands(launch_command(mtp, "vllm"), "vllm serve")[0], "--speculative-config")) == \
        {"method": "mtp", "num_speculative_tokens": 2}
    tree = replace(LAYOUT, speculative=searched("eagle3", 3, topk=4, draft_tokens=16))
    [cmd] = commands(launch_command(tree, "sglang"), "python -m sglang.launch_server")
    assert (flag(cmd, "--speculative-algorithm"), flag(cmd, "--speculative-num-steps"),
            flag(cmd, "--speculative-eagle-topk"), flag(cmd, "--speculative-num-draft-tokens")) == ("EAGLE3", "3", "4", "16")
    draft = replace(LAYOUT, speculative=searched("draft", 4, draft_model="meta-llama/Llama-3.2-1B"))
    [cmd] = commands(launch_command(draft, "sglang"), "python -m sglang.launch_server")
    assert flag(cmd, "--speculative-algorithm") == "STANDALONE" and \
        flag(cmd, "--speculative-draft-model-path") == "meta-llama/Llama-3.2-1B"
    [options] = yaml_files(launch_command(draft, "trtllm")).values()
    assert options["speculative_config"] == {"decoding_type": "DraftTarget", "max_draft_len": 4,
                                             "speculative_model": "meta-llama/Llama-3.2-1B"}
    [options] = yaml_files(launch_command(mtp, "trtllm")).values()
    assert options["speculative_config"] == {"decoding_type": "MTP", "num_nextn_predict_layers": 2}
    for engine in ("vllm", "trtllm"):     # SGLang's tree flags only
        with pytest.raises(ValueError, match="tree drafts"):
            launch_command(tree, engine)
    assert "--speculative" not in launch_command(LAYOUT, "sglang")
