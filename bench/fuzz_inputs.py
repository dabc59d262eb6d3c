"""Run the issue-13 classes of bad input through every CLI as subprocesses and count what goes wrong.

    python bench/fuzz_inputs.py [--jobs 2] [--timeout 60] [--only text_generate,serving_sim,...] [--verbose]

Classes: every numeric flag at negative, zero, huge, NaN, inf and text; malformed model configs, profiles,
workloads, hit-rate distributions and measurement folders; inconsistent layouts. Each run is classified:
traceback, timeout, bad numbers (NaN/inf/negative in the output, or non-strict JSON), silent acceptance (an
inconsistent setup answered with neither an error nor a warning), data rewritten (a bundled profile changed), or ok.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BAD_VALUES = ["-1", "0", "1000000000000", "nan", "inf", "abc"]
NONFINITE_TEXT = re.compile(r"(?<![A-Za-z_])-?(nan|inf|infinity)(?![A-Za-z_])", re.IGNORECASE)


@dataclass
class Case:
    cli: str
    label: str
    argv: list[str]
    inconsistent: bool = False      # must be refused or warned about


def _json_numbers(value):
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, (int, float)):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _json_numbers(v)
    elif isinstance(value, list):
        for v in value:
            yield from _json_numbers(v)


def _bad_numbers(stdout: str) -> bool:
    text = stdout.strip()
    if not text:
        return False
    try:
        docs = [json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))]
    except ValueError as e:
        if str(e) in ("NaN", "Infinity", "-Infinity"):
            return True
        try:   # JSON lines (cost.kernel)
            docs = [json.loads(line) for line in text.splitlines()]
        except ValueError:
            return bool(NONFINITE_TEXT.search(text))   # a table
    return any(not math.isfinite(x) or x < 0 for d in docs for x in _json_numbers(d))


def classify(case: Case, timeout: float) -> tuple[str, str, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, "-m", case.cli, *case.argv], capture_output=True, text=True, cwd=ROOT,
                           env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", "", time.perf_counter() - start
    seconds = time.perf_counter() - start
    last = (r.stderr.strip().splitlines() or [""])[-1]
    if "Traceback" in r.stderr:
        return "traceback", last, seconds
    if r.returncode == 0:
        if _bad_numbers(r.stdout):
            return "bad numbers", r.stdout[:200], seconds
        if case.inconsistent and "warning" not in (r.stderr + r.stdout).lower():
            return "silent acceptance", "", seconds
        return "ok (answered)", "", seconds
    if r.returncode != 2:
        return f"exit {r.returncode}", last, seconds
    return "ok (refused)", last, seconds


def write(folder: Path, name: str, content) -> str:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def cases(tmp: Path) -> list[Case]:
    out: list[Case] = []
    tg, ss = "cli.inference.text_generate", "cli.inference.serving_sim"
    base_tg = ["llama-3.2-1b", "--device", "h200", "-q", "256", "--json"]
    for flag in ("--num-queries", "--query-length", "--context-length", "--prefix-cache-hit-rate", "--tp-size",
                 "--ep-size", "--moe-imbalance", "--sweep-prefix-cache-hit-rate"):
        for v in BAD_VALUES:
            out.append(Case(tg, f"{flag} {v}", [*base_tg, flag, v]))
    base_ss = ["llama-3.2-1b", "--device", "h200", "--workload", "random", "--num-requests", "20", "--input-tokens",
               "256", "--output-tokens", "8", "--jobs", "1", "--json"]
    for flag in ("--num-requests", "--request-rate", "--time-scale", "--block-size", "--gpu-cache-gb", "--cpu-cache-gb",
                 "--instances", "--max-prefill-tokens", "--max-running", "--hit-window-s", "--concurrency", "--tp-size",
                 "--input-tokens", "--output-tokens", "--seed", "--sweep-gpu-cache-gb", "--kv-cache-tokens"):
        for v in BAD_VALUES:
            out.append(Case(ss, f"{flag} {v}", [*base_ss, flag, v]))
    for flag in ("--system-tokens", "--turns", "--user-tokens"):
        for v in BAD_VALUES:
            out.append(Case(ss, f"multi-turn {flag} {v}", [*base_ss, "--workload", "multi-turn-chat", flag, v]))
    for flag in ("--num-queries", "--query-length", "--context-length"):
        for v in BAD_VALUES:
            out.append(Case("tracer", f"{flag} {v}", ["llama-3.2-1b", flag, v, "--json"]))
    out.append(Case("tracer", "--list", ["--list"]))

    # model configs
    llama = json.loads((ROOT / "tracer/configs/llama-3.2-1b/config.json").read_text())
    mixtral = json.loads((ROOT / "tracer/configs/mixtral-8x7b/config.json").read_text())
    configs = {"layers-1e6": {**llama, "num_hidden_layers": 10**6}, "layers-0": {**llama, "num_hidden_layers": 0},
               "layers-neg": {**llama, "num_hidden_layers": -1}, "vocab-0": {**llama, "vocab_size": 0},
               "inter-0": {**llama, "intermediate_size": 0}, "kv-5": {**llama, "num_key_value_heads": 5},
               "kv-64": {**llama, "num_key_value_heads": 64}, "hidden-text": {**llama, "hidden_size": "big"},
               "heads-0": {**llama, "num_attention_heads": 0}, "experts-0": {**mixtral, "num_local_experts": 0},
               "topk-0": {**mixtral, "num_experts_per_tok": 0}, "topk-9": {**mixtral, "num_experts_per_tok": 9},
               "no-model-type": {k: v for k, v in llama.items() if k != "model_type"}, "a-list": [1, 2]}
    for name, config in configs.items():
        path = write(tmp, f"configs/{name}/config.json", config)
        out.append(Case("tracer", f"config {name}", [path, "-q", "16"]))
        out.append(Case(tg, f"config {name}", [path, "--device", "h200", "-q", "16"]))
    out.append(Case(tg, "config not JSON", [write(tmp, "configs/broken/config.json", "{oops"), "--device", "h200"]))

    # profiles
    h200 = json.loads((ROOT / "hw_profiles/h200.json").read_text())

    def mutated(path, value):
        data = copy.deepcopy(h200)
        *parents, last = path.split(".")
        node = data
        for p in parents:
            node = node[p]
        node[last] = value
        return data
    profiles = {"interconnect-text": mutated("interconnect", "nvlink"), "aliases-number": mutated("aliases", 5),
                "efficiency-number": mutated("efficiency", 3), "gemm-text": mutated("efficiency.gemm.compute", "0.7"),
                "gemm-0": mutated("efficiency.gemm.compute", 0), "tile-0": mutated("efficiency.gemm.tile_m", 0),
                "eff-neg": mutated("efficiency.attention.memory", -0.5), "cu-0": mutated("compute_units", 0),
                "cu-neg": mutated("compute_units", -4), "bw-nan": mutated("memory.bandwidth_gbps", float("nan")),
                "bw-inf": mutated("memory.bandwidth_gbps", float("inf")),
                "cap-inf": mutated("memory.capacity_gb", float("inf")),
                "peak-nan": mutated("matrix_tflops.bf16", float("nan")),
                "launch-inf": mutated("kernel_launch_us", float("inf")), "unknown-field": mutated("colour", "blue"),
                "engine-out-of-range": mutated("engines.vllm.gemm.bf16.compute", 9.0),
                "engines-text": mutated("engines", "vllm")}
    for name, data in profiles.items():
        text = json.dumps(data)   # json writes NaN/Infinity, as a hand-edited file might
        path = write(tmp, f"profiles/{name}.json", text)
        out.append(Case("hw_profiles", f"profile {name}", [path]))
        out.append(Case(tg, f"profile {name}", ["llama-3.2-1b", "--device", path, "-q", "16", "--json"]))
    non_utf8 = write(tmp, "profiles/non-utf8.json", b'{"name": "\xff\xfe"}')
    out += [Case("hw_profiles", "profile non-UTF-8", [non_utf8]),
            Case(tg, "profile non-UTF-8", ["llama-3.2-1b", "--device", non_utf8])]

    # workloads
    good = {"arrival_s": 0, "segments": [{"id": "s", "tokens": 64}], "output_tokens": 4}
    workloads = {"nan-arrival": '{"arrival_s": NaN, "segments": [{"id": "s", "tokens": 8}], "output_tokens": 2}',
                 "inf-arrival": '{"arrival_s": Infinity, "segments": [{"id": "s", "tokens": 8}], "output_tokens": 2}',
                 "1e300-arrival": {**good, "arrival_s": 1e300}, "huge-segment": {**good, "segments": [
                     {"id": "s", "tokens": 10**12}]}, "zero-output": {**good, "output_tokens": 0},
                 "text-tokens": {**good, "output_tokens": "many"}, "unknown-field": {**good, "colour": 1},
                 "no-prompt": {"arrival_s": 0, "output_tokens": 2}, "array": [1, 2], "empty": ""}
    for name, line in workloads.items():
        text = (line if isinstance(line, str) else json.dumps(line)) + "\n"
        path = write(tmp, f"workloads/{name}.jsonl", json.dumps(good) + "\n" + text)
        out.append(Case(ss, f"workload {name}", ["llama-3.2-1b", "--device", "h200", "--workload", path, "--json"]))
    moon = write(tmp, "workloads/mooncake-bad.jsonl", '{"timestamp": -5, "input_length": 10, "output_length": 1, '
                                                      '"hash_ids": [1]}\n')
    out.append(Case(ss, "mooncake negative timestamp", ["llama-3.2-1b", "--device", "h200", "--workload",
                                                        f"mooncake:{moon}"]))

    # hit-rate distributions (read by the optimizer)
    for name, text in {"nan": "[0.1, NaN]", "one": "0.2\n1.0\n", "text": "0.2\nabc\n", "empty": "[]",
                       "bool": "[true]", "non-utf8": b"\xff\xfe"}.items():
        path = write(tmp, f"distributions/{name}.txt", text)
        out.append(Case("cli.inference.throughput_optimizer", f"distribution {name}",
                        ["llama-3.2-1b", "--device", "h200", "--prefix-cache-hit-rate-distribution", path]))

    # measurement folders
    shared = ROOT / "tests/data/measurements/h200"
    scen = json.loads((shared / "scenarios.json").read_text())

    def folder(name, edit):
        data = copy.deepcopy(scen)
        edit(data)
        d = tmp / "measurements" / name
        d.mkdir(parents=True, exist_ok=True)
        for f in ("microbench.json", "model_configs.json"):
            (d / f).write_text((shared / f).read_text())
        (d / "scenarios.json").write_text(json.dumps(data))
        return str(d)
    edits = {"zero": lambda d: d.update(scenarios=[]),
             "negative": lambda d: d["scenarios"][0]["by_class_ms"].update(gemm=-1.0),
             "nan": lambda d: d["scenarios"][0].update(gpu_kernel_ms=float("nan")),
             "text": lambda d: d["scenarios"][0].update(batch="one")}
    for name, edit in edits.items():
        path = folder(name, edit)
        for extra in ([], ["--write-profile"]):
            out.append(Case("cost.calibrate", f"measurements {name} {' '.join(extra)}",
                            [path, "--output", str(tmp / f"calibrated-{name}.json"), *extra]))
    out.append(Case("cost.calibrate", "measurements missing", [str(tmp / "nowhere")]))

    # inconsistent layouts (refused, or answered with a stated warning)
    for tp in ("3", "5", "64", "16"):
        out.append(Case(tg, f"layout tp {tp} on 32 heads", ["llama-3.2-1b", "--device", "h200", "-q", "64",
                                                             "--tp-size", tp], inconsistent=True))
    out += [Case(tg, "layout ep 8 on dense", ["llama-3.2-1b", "--device", "h200", "-q", "64", "--ep-size", "8"], True),
            Case(tg, "layout moe-imbalance on dense", ["llama-3.2-1b", "--device", "h200", "-q", "64",
                                                       "--moe-imbalance", "2"], True),
            Case(tg, "layout ep 3 on 8 experts", ["mixtral-8x7b", "--device", "h200", "-q", "64", "--ep-size", "3"],
                 True),
            Case(tg, "input beyond max_position_embeddings", ["mistral-7b", "--device", "h200", "-q", "40000"], True),
            Case(ss, "layout tp 3", ["llama-3.2-1b", "--device", "h200", "--workload", "random", "--tp-size", "3"],
                 True),
            Case(tg, "plot into a missing folder", ["llama-3.2-1b", "--device", "h200", "--sweep-prefix-cache-hit-rate",
                                                    "0,0.5", "--plot", str(tmp / "no/such/x.png")]),
            Case(tg, "plot without a sweep", ["llama-3.2-1b", "--device", "h200", "--plot", str(tmp / "x.png")], True)]
    return out


def profile_digests() -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((ROOT / "hw_profiles").glob("*.json"))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds before a case counts as a hang (default 60)")
    p.add_argument("--only", default=None, help="comma-separated CLI modules or prefixes to run")
    p.add_argument("--verbose", action="store_true", help="print every case's outcome")
    args = p.parse_args()
    os.environ.setdefault("TRACECOST_CACHE_DIR", tempfile.mkdtemp(prefix="tracecost-fuzz-cache-"))
    with tempfile.TemporaryDirectory(prefix="tracecost-fuzz-") as tmp:
        todo = cases(Path(tmp))
        if args.only:
            keys = args.only.split(",")
            todo = [c for c in todo if any(k in c.cli for k in keys)]
        before = profile_digests()
        start = time.perf_counter()
        with ThreadPoolExecutor(args.jobs) as pool:
            results = list(pool.map(lambda c: (c, *classify(c, args.timeout)), todo))
        rewritten = [n for n, d in profile_digests().items() if before.get(n) != d]
    counts: dict[str, int] = {}
    for case, outcome, detail, seconds in results:
        counts[outcome] = counts.get(outcome, 0) + 1
        if args.verbose or not outcome.startswith("ok"):
            print(f"{outcome:18s} {seconds:5.1f}s  {case.cli} {case.label}: {detail[:160]}")
    answered = [f"{c.cli.split('.')[-1]} {c.label}" for c, outcome, _, _ in results if outcome == "ok (answered)"]
    print(f"\nanswered (exit 0): {'; '.join(answered)}")
    print(f"\n{len(results)} cases in {time.perf_counter() - start:.0f} s")
    for outcome in ("traceback", "timeout", "bad numbers", "silent acceptance", "ok (refused)", "ok (answered)"):
        print(f"  {outcome:18s} {counts.pop(outcome, 0)}")
    for outcome, n in counts.items():
        print(f"  {outcome:18s} {n}")
    print(f"  bundled profiles rewritten: {len(rewritten)} {rewritten or ''}")
    slowest = max(results, key=lambda r: r[3])
    print(f"  slowest case: {slowest[3]:.1f} s ({slowest[0].cli} {slowest[0].label})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
