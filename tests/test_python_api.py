"""The Python API example of docs/python_api.md runs and prices one trace many ways."""
import runpy
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "trace_once_cost_many.py"


def test_trace_once_cost_many_example(capsys):
    rows = runpy.run_path(str(EXAMPLE))["main"]()
    assert len(rows) == 12 and "llama-3.1-8b" in capsys.readouterr().out
    by = {(r["device"], r["tp"], r["execution"]): r for r in rows}
    h100, b200 = (next(d for d, _, _ in by if key in d) for key in ("H100", "B200"))
    engine = {k: v for k, v in by.items() if k[2] == "engine"}
    assert engine[(b200, 1, "engine")]["tpot_ms"] < engine[(h100, 1, "engine")]["tpot_ms"]   # more bandwidth
    assert engine[(h100, 2, "engine")]["ttft_ms"] < engine[(h100, 1, "engine")]["ttft_ms"]   # TP splits the work
    assert by[(h100, 1, "eager")]["tpot_ms"] > by[(h100, 1, "engine")]["tpot_ms"]          # unfused is slower
