"""Architecture coverage: every causal-LM model type of the installed transformers, traced as a new user would.

    python bench/arch_coverage.py [--jobs 2] [--only gpt2,llama] [--json out.json] [--timeout 180]

For each `model_type` in transformers' MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, and the text backbone of each one in
MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES: the default config (`AutoConfig.for_model`) is written as a
config.json by transformers itself, then

- HF builds it on meta with its own attention (a model HF cannot build is out of scope, not a failure);
- `python -m tracer` (prefill B=2 Q=64 C=128, decode B=2 C=256) and `text_generate` (same shapes, H100);
- the checks: the tracer's own, which run on every trace (the FLOP identity, attention and recurrent state
  seeing the cache) and on the first trace of each model class (the layer dedup self-test: traced with and
  without dedup), must have run and passed; and the hand-written formulas must agree within 0.5% or say that
  no formula covers the model type.

Outcome per model type: `ok`, `WRONG` (exit 0 but a check failed: a silent wrong number), `unsupported: ...`
(a one-line refusal saying what is not modelled), `refused: ...` (any other one-line error), `crash`
(traceback, hang or timeout), or `hf cannot build` (out of scope). The table and a summary go to stdout.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PREFILL = ["-b", "2", "-q", "64", "-c", "128"]
DECODE = ["--decode", "-b", "2", "-c", "256"]
DEVICE = "h100"
TOLERANCE = 0.005


def entries() -> list[tuple[str, str]]:
    """(model_type, mapping) for the sweep: causal-LM types, then image-text-to-text types not already swept."""
    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)
    causal = sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    vlm = sorted(set(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES) - set(causal))
    return [(m, "causal-lm") for m in causal] + [(m, "image-text") for m in vlm]


def _call(main, argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
        except BaseException:  # noqa: BLE001 - a traceback is an outcome here
            traceback.print_exc()
            rc = 1
    return rc, out.getvalue(), err.getvalue()


def _hf_builds(model_type: str, mapping: str, config) -> str | None:
    """None when HF itself builds the default config on meta, else why not."""
    import warnings

    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    auto = AutoModelForCausalLM if mapping == "causal-lm" else AutoModelForImageTextToText
    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            auto.from_config(config)
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:120]
    return None


def _error_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    if not lines:
        return "no message"
    if any(ln.startswith("Traceback") for ln in lines):
        return "traceback: " + lines[-1][:140]
    line = lines[-1]
    return line[len("error: "):] if line.startswith("error: ") else line


def _checks(model_type: str, path: str, prefill: dict) -> list[str]:
    """The bench's own checks on the prefill trace: dedup, FLOP identity, formulas. Returns failures/notes."""
    from tracer import Request, TraceOptions, trace
    from tracer.model_source import resolve_model
    problems, notes = [], []
    spec = resolve_model(path)
    req = Request(2, 64, 128)
    dedup = trace(spec, req, TraceOptions(dtype="bf16"))
    for name in ("flop_identity", "cache", "dedup"):
        verdict = dedup.checks.get(name, "missing")
        if name == "flop_identity" and not verdict.startswith("holds"):
            problems.append(f"FLOP identity not verified ({verdict})")
        elif name == "dedup" and verdict != "ok":  # the tracer's self-test found dedup unsafe and traced every layer
            notes.append(f"dedup off: {verdict}")
    from tracer.formulas import NoFormula, full_config, model_flops
    try:
        formula = model_flops(full_config(spec), req)
    except NoFormula as e:
        notes.append(str(e))
    else:
        traced = dedup.flops_by_class()
        for cls in ("gemm", "attention"):
            if abs(traced[cls] - formula[cls]) > TOLERANCE * max(formula[cls], 1.0):
                problems.append(f"formula {cls} {(traced[cls] / max(formula[cls], 1.0) - 1) * 100:+.2f}%")
    return problems + ["~" + n for n in notes]


def run_entry(model_type: str, mapping: str, workdir: str) -> dict:
    """One model type through both CLIs and the checks."""
    import warnings
    warnings.simplefilter("ignore")
    from transformers import AutoConfig

    from cli.inference.text_generate import main as tg_main
    from tracer.__main__ import main as tracer_main
    start, cpu = time.perf_counter(), time.process_time()
    row = {"model_type": model_type, "mapping": mapping}
    try:
        config = AutoConfig.for_model(model_type)
    except Exception as e:  # noqa: BLE001
        return dict(row, outcome="hf cannot build", reason=f"no default config: {type(e).__name__}", seconds=0.0)
    folder = Path(workdir) / model_type
    folder.mkdir(parents=True, exist_ok=True)
    config.to_json_file(str(folder / "config.json"))
    path = str(folder)
    runs = {}
    for name, main, argv in (
            ("trace prefill", tracer_main, [path, *PREFILL, "--json"]),
            ("trace decode", tracer_main, [path, *DECODE, "--json"]),
            ("text_generate prefill", tg_main, [path, "--device", DEVICE, *PREFILL, "--json"]),
            ("text_generate decode", tg_main, [path, "--device", DEVICE, *DECODE, "--json"])):
        runs[name] = _call(main, argv)
    failed = [(n, r) for n, r in runs.items() if r[0] != 0]
    row["seconds"] = 0.0
    why = _hf_builds(model_type, mapping, config) if failed else None  # out of scope when HF itself cannot build it
    if why is not None:
        return dict(row, outcome="hf cannot build", reason=why, seconds=time.perf_counter() - start)
    if failed:
        name, (rc, _, err) = failed[0]
        line = _error_line(err)
        if rc == 2 and line.startswith("unsupported:"):
            outcome = "unsupported"
        elif rc == 2 and "Traceback" not in err:
            outcome = "refused"
        else:
            outcome = "crash"
        row.update(outcome=outcome, reason=f"{name}: {line}" if outcome == "crash" else line)
    else:
        prefill = json.loads(runs["trace prefill"][1])
        row["notes"] = prefill.get("notes", [])
        try:
            found = _checks(model_type, path, prefill)
        except Exception as e:  # noqa: BLE001
            found = [f"check crashed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"]
        problems = [p for p in found if not p.startswith("~")]
        row["formula"] = "; ".join(p[1:] for p in found if p.startswith("~")) or "formula within 0.5%"
        mismatch = [p for p in problems if p.startswith("formula")]
        if len(mismatch) < len(problems):
            row.update(outcome="WRONG", reason="; ".join(problems))
        elif mismatch:
            row.update(outcome="formula mismatch", reason="; ".join(problems))
        else:
            row.update(outcome="ok", reason="")
        row["flops"] = prefill["flops"]
    row["seconds"] = time.perf_counter() - start
    row["cpu_seconds"] = time.process_time() - cpu
    return row


def _worker(tasks, results, workdir):
    os.environ.setdefault("TRACECOST_NO_CACHE", "1")
    from transformers.utils import logging
    logging.set_verbosity_error()
    while True:
        task = tasks.get()
        if task is None:
            return
        index, model_type, mapping = task
        results.put(("start", index, os.getpid()))
        try:
            row = run_entry(model_type, mapping, workdir)
        except BaseException as e:  # noqa: BLE001
            row = {"model_type": model_type, "mapping": mapping, "outcome": "crash",
                   "reason": f"bench: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
        results.put(("done", index, row))


def sweep(todo: list[tuple[str, str]], jobs: int, timeout: float) -> list[dict]:
    """Run entries in `jobs` forked workers; a worker past `timeout` on one entry is killed and replaced."""
    import queue
    ctx = mp.get_context("fork")
    workdir = tempfile.mkdtemp(prefix="arch-coverage-")
    tasks, results = ctx.Queue(), ctx.Queue()
    for i, (m, mapping) in enumerate(todo):
        tasks.put((i, m, mapping))
    workers = {}

    def spawn():
        p = ctx.Process(target=_worker, args=(tasks, results, workdir), daemon=True)
        p.start()
        workers[p.pid] = p

    for _ in range(jobs):
        spawn()
    rows: dict[int, dict] = {}
    running: dict[int, tuple[int, float]] = {}  # pid -> (index, start)
    while len(rows) < len(todo):
        try:
            msg = results.get(timeout=1.0)
        except queue.Empty:
            msg = None
        if msg is not None:
            kind, index, payload = msg
            if kind == "start":
                running[payload] = (index, time.perf_counter())
            else:
                rows[index] = payload
                for pid, (i, _) in list(running.items()):
                    if i == index:
                        del running[pid]
                print(f"[{len(rows)}/{len(todo)}] {payload['model_type']}: {payload['outcome']} "
                      f"({payload.get('seconds', 0):.1f} s) {payload.get('reason', '')[:100]}", file=sys.stderr,
                      flush=True)
        now = time.perf_counter()
        for pid, (index, started) in list(running.items()):
            dead = not workers[pid].is_alive()
            if now - started > timeout or dead:
                workers[pid].kill()
                workers[pid].join()
                del running[pid], workers[pid]
                m, mapping = todo[index]
                rows[index] = {"model_type": m, "mapping": mapping, "outcome": "crash",
                               "reason": "timeout" if not dead else "worker died", "seconds": now - started}
                print(f"[{len(rows)}/{len(todo)}] {m}: crash ({rows[index]['reason']})", file=sys.stderr, flush=True)
                spawn()
    for _ in workers:
        tasks.put(None)
    for p in workers.values():
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    return [rows[i] for i in range(len(todo))]


def summary(rows: list[dict]) -> dict:
    causal = [r for r in rows if r["mapping"] == "causal-lm"]
    buildable = [r for r in causal if r["outcome"] != "hf cannot build"]
    count = {}
    for r in buildable:
        key = r["outcome"]
        count[key] = count.get(key, 0) + 1
    vlm = [r for r in rows if r["mapping"] == "image-text" and r["outcome"] != "hf cannot build"]
    return {"causal_lm_types": len(causal), "hf_buildable": len(buildable), "outcomes": count,
            "ok_share": count.get("ok", 0) / max(1, len(buildable)),
            "image_text_buildable": len(vlm), "image_text_ok": sum(r["outcome"] == "ok" for r in vlm),
            "wrong": sum(r["outcome"] == "WRONG" for r in rows)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--only", default=None, help="comma-separated model types")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds per model type")
    p.add_argument("--json", default=None, help="also write the rows and summary to this file")
    args = p.parse_args(argv)
    start = time.perf_counter()
    import transformers

    from tracer.table import format_table
    from tracer.trace import prepare
    prepare()  # heavy imports once, before the workers fork
    import cli.inference.text_generate  # noqa: F401
    todo = entries()
    if args.only:
        wanted = set(args.only.split(","))
        todo = [e for e in todo if e[0] in wanted]
    rows = sweep(todo, args.jobs, args.timeout)
    table = format_table(["model type", "mapping", "outcome", "reason / formula"],
                         [[r["model_type"], r["mapping"], r["outcome"],
                           (r.get("reason") or r.get("formula", ""))[:110]] for r in rows])
    print(table)
    s = summary(rows)
    elapsed = time.perf_counter() - start
    cpu = sum(r.get("cpu_seconds", r.get("seconds", 0.0)) for r in rows)
    print()
    print(f"transformers {transformers.__version__}, {args.jobs} jobs: {elapsed:.0f} s wall, {cpu:.0f} s CPU in the "
          f"workers ({cpu / max(1, args.jobs):.0f} s per job)")
    print(f"causal-LM model types: {s['causal_lm_types']}, HF builds {s['hf_buildable']} on meta; "
          f"ok {s['outcomes'].get('ok', 0)} ({s['ok_share'] * 100:.1f}%); "
          + ", ".join(f"{k} {v}" for k, v in sorted(s["outcomes"].items()) if k != "ok"))
    print(f"image-text-to-text (text backbone, not already swept): {s['image_text_buildable']} built by HF, "
          f"{s['image_text_ok']} ok; silent wrong results: {s['wrong']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"transformers": transformers.__version__, "seconds": elapsed,
                                               "summary": s, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
