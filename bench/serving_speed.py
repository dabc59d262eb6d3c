"""Wall and CPU time of serving_sim runs on one core (Llama-3.1-8B on H100, the disk trace cache off), and the
simulated requests per CPU second: 10,000 and 100,000 multi-turn-chat requests at 20 requests/s; and, given the
Mooncake conversation trace, the whole trace at four GPU cache sizes (one instance; four instances with
cache-aware routing), the sizes one after another in one process.

    python bench/serving_speed.py [--mooncake FAST25-release/traces/conversation_trace.jsonl] [--json]

Each run is a fresh process pinned to one CPU (os.sched_setaffinity), so "one core" is what it measures.
CPU time is the process's user + system time: on a shared machine it is the steadier number. The bare imports
every run pays (torch and transformers, as `python -c "import torch; from transformers import LlamaForCausalLM"`)
are timed the same way and reported apart.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cli.progress import Progress  # noqa: E402
from tracer.table import format_table  # noqa: E402

CHAT = ["--workload", "multi-turn-chat", "--request-rate", "20"]
SWEEP = ["--sweep-gpu-cache-gb", "8,16,32,64", "--jobs", "1"]
RUNS = {
    "10,000 multi-turn-chat requests": [*CHAT, "--num-requests", "10000"],
    "100,000 multi-turn-chat requests": [*CHAT, "--num-requests", "100000"],
    "Mooncake conversation trace, 1 instance, 4 GPU cache sizes": ["--workload", "mooncake:{trace}", *SWEEP],
    "Mooncake conversation trace, 4 instances, 4 GPU cache sizes": [
        "--workload", "mooncake:{trace}", "--instances", "4", "--routing", "cache-aware", *SWEEP],
}
BARE_IMPORTS = [sys.executable, "-c", "import torch; from transformers import LlamaForCausalLM"]


def _one_core() -> None:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def timed(command: list[str]) -> tuple[float, float, str]:
    """(wall s, CPU s, stdout) of one pinned child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, check=True, capture_output=True, text=True, preexec_fn=_one_core,
                          env=dict(os.environ, TRACECOST_NO_CACHE="1"))
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done.stdout


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mooncake", default=None, help="FAST25-release/traces/conversation_trace.jsonl")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = p.parse_args()
    if args.mooncake and not Path(args.mooncake).is_file():
        p.error(f"--mooncake: no file {args.mooncake}")
    runs = {label: [a.replace("{trace}", args.mooncake or "") for a in run] for label, run in RUNS.items()
            if args.mooncake or "{trace}" not in " ".join(run)}
    rows = []
    with Progress(len(runs) + 1, "runs") as bar:
        bar.describe("bare imports")
        _, imports_cpu, _ = timed(BARE_IMPORTS)
        bar.update()
        for label, run in runs.items():
            bar.describe(label[:40])
            wall, cpu, out = timed([sys.executable, "-m", "cli.inference.serving_sim", "llama-3.1-8b", "--device",
                                    "h100", *run, "--json"])
            result = json.loads(out)
            simulated = result["num_requests"] * len(result["runs"])
            rows.append({"run": label, "requests_simulated": simulated, "wall_s": wall, "cpu_s": cpu,
                         "cpu_beyond_imports_s": cpu - imports_cpu, "requests_per_cpu_s": simulated / cpu})
            bar.update()
    if args.json:
        print(json.dumps({"bare_imports_cpu_s": imports_cpu, "runs": rows}, indent=1))
        return 0
    print(format_table(["run", "requests simulated", "wall s", "CPU s", "CPU beyond imports s", "requests / CPU s"],
                       [[r["run"], f"{r['requests_simulated']:,}", f"{r['wall_s']:.1f}", f"{r['cpu_s']:.1f}",
                         f"{r['cpu_beyond_imports_s']:.1f}", f"{r['requests_per_cpu_s']:,.0f}"] for r in rows],
                       title=f"serving_sim on one core, process start included (bare imports: {imports_cpu:.1f} s "
                             f"CPU)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
