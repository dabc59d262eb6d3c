"""Examples that stay true: re-run every example in the README and docs/ and compare (or rewrite) its output.

    python bench/readme_examples.py --check      # exit 1 when an example's printed output differs
    python bench/readme_examples.py --write      # rewrite the outputs in place
    [--files README.md docs/throughput_optimizer.md] [--timeout 900]

An example is a fenced block whose first line starts with `$ ` (a command, continued with trailing
backslashes); the lines after the command are its standard output. Commands that read a file this checkout
does not have (e.g. a downloaded Mooncake trace) are skipped and listed. Part of the release routine
(README, "Layout"): run --check before tagging; CI does not run it (it takes minutes).
"""
from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"```\n(\$ .*?)```", re.S)


def examples(text: str):
    """(start, end, command, output) of every example block's body."""
    for m in BLOCK.finditer(text):
        body = m.group(1).split("\n")
        cmd_lines = []
        for i, line in enumerate(body):
            cmd_lines.append(line[2:] if i == 0 else line.strip())
            if not line.rstrip().endswith("\\"):
                break
        command = " ".join(x.rstrip("\\").strip() for x in cmd_lines)
        output = "\n".join(body[len(cmd_lines):])
        start = m.start(1) + sum(len(x) + 1 for x in body[:len(cmd_lines)])
        yield start, m.end(1), command, output


def missing_input(command: str) -> str | None:
    for token in shlex.split(command):
        value = token.split(":", 1)[1] if token.startswith("mooncake:") else token
        if value.endswith((".jsonl", ".json", ".txt")) and not (ROOT / value).exists():
            return value
    return None


def run(command: str, timeout: int) -> str:
    args = shlex.split(command)
    if args[0] == "python":
        args[0] = sys.executable
    r = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"exit {r.returncode}: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ''}")
    return r.stdout


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 when an output differs")
    mode.add_argument("--write", action="store_true", help="rewrite the outputs in place")
    p.add_argument("--files", nargs="*", default=None, help="markdown files (default: README.md and docs/*.md)")
    p.add_argument("--timeout", type=int, default=900, help="seconds per command (default 900)")
    args = p.parse_args(argv)
    files = [Path(f) for f in args.files] if args.files else [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    differ, skipped, failed = [], [], []
    for path in files:
        text = path.read_text()
        edits = []
        for start, end, command, output in examples(text):
            need = missing_input(command)
            if need:
                skipped.append(f"{path.name}: {command[:70]}... (needs {need})")
                continue
            try:
                fresh = run(command, args.timeout)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                failed.append(f"{path.name}: {command[:70]}...: {e}")
                continue
            if fresh.rstrip("\n") != output.rstrip("\n"):
                differ.append(f"{path.name}: {command[:90]}")
                edits.append((start, end, fresh))
        if args.write and edits:
            for start, end, fresh in reversed(edits):
                text = text[:start] + fresh.rstrip("\n") + "\n" + text[end:]
            path.write_text(text)
    for title, items in (("differ", differ), ("skipped", skipped), ("failed", failed)):
        for item in items:
            print(f"{title}: {item}")
    print(f"{len(differ)} differ{' (rewritten)' if args.write else ''}, {len(skipped)} skipped, {len(failed)} failed")
    return 1 if (args.check and differ) or failed else 0


if __name__ == "__main__":
    sys.exit(main())
