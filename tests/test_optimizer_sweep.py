"""cli/inference/optimizer_sweep.py: many optimizer searches in a process pool, each the same as run alone."""
from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout

from cli.inference import optimizer_sweep, throughput_optimizer

FLAGS = ["--num-devices", "1", "--input-length", "512", "--output-length", "64", "--tpot-limit", "40"]


def _run(main, argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as e:      # argparse's refusals: one line, exit 2
            rc = e.code
    return rc, out.getvalue(), err.getvalue()


def test_pool_gives_each_point_its_own_search():
    argv = ["--models", "llama-3.2-1b", "--devices", "h100,nodevice", "--request-rates", "1,4", "--jobs", "2",
            "--", *FLAGS]
    rc, out, _ = _run(optimizer_sweep.main, argv)
    lines = [json.loads(x) for x in out.splitlines()]
    assert rc == 0 and [(x["device"], x["request_rate"]) for x in lines] == \
        [("h100", 1.0), ("h100", 4.0), ("nodevice", 1.0), ("nodevice", 4.0)]
    for x in lines[:2]:     # the same best candidate as the optimizer run alone at that point
        rc, alone, _ = _run(throughput_optimizer.main, ["llama-3.2-1b", "--device", "h100", *FLAGS, "--request-rate",
                                                        repr(x["request_rate"]), "--json"])
        assert rc == 0 and x["best"] == json.loads(alone)["best"] and x["best"]["request_rate"] == x["request_rate"]
    # a point that fails says why on its own line; the others are answered
    assert all("nodevice" in x["error"] and "\n" not in x["error"] for x in lines[2:])
    serial = _run(optimizer_sweep.main, [*argv[:-len(FLAGS) - 3], "--jobs", "1", "--", *FLAGS])[1]
    assert serial == out


def test_sweep_flags_refused_in_one_line(monkeypatch):
    rc, _, err = _run(optimizer_sweep.main, ["--models", "llama-3.2-1b", "--devices", "h100", "--", "--device",
                                             "h200", *FLAGS])
    assert rc == 2 and "set by the sweep" in err.splitlines()[-1]
    monkeypatch.setenv("TRACECOST_MAX_SWEEP_POINTS", "3")
    rc, _, err = _run(optimizer_sweep.main, ["--models", "a,b", "--devices", "h100,h200", "--", *FLAGS])
    assert rc == 2 and err.count("\n") == 1 and "TRACECOST_MAX_SWEEP_POINTS" in err
