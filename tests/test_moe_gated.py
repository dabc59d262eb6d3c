"""Issue 23 item 5: an MoE layer's experts are gated (SwiGLU: gate, up, down) or not (relu^2, Nemotron-H: up,
down), from the traced module through the engine's fused-MoE call to `python -m cost.kernel` rows."""
import json

import pytest

from cost.execution import build_kernels
from cost.kernel import main as kernel_main
from cost.kernel_rows import RowError, parse_row
from tracer import Request, TraceOptions, trace
from tracer.model_source import resolve_model

ROW = {"op": "moe", "tokens": 4096, "hidden": 2688, "inter": 1856, "experts": 128, "top_k": 6, "dtype": "bf16"}


def _priced(tmp_path, capsys, rows) -> list[float]:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert kernel_main(["--device", "h200", "--jsonl", str(path)]) == 0
    return [json.loads(line)["ms"] for line in capsys.readouterr().out.splitlines()]


def test_kernel_rows_take_gated(tmp_path, capsys):
    assert parse_row(ROW, 1).gated and not parse_row({**ROW, "gated": False}, 1).gated
    gated, default, ungated = _priced(tmp_path, capsys, [{**ROW, "gated": True}, ROW, {**ROW, "gated": False}])
    assert gated == default
    # two GEMMs of the three; the fused kernel's fixed and per-token terms stay, so more than 2/3 of the time
    assert 0.5 * gated < ungated < gated
    with pytest.raises(RowError, match="'gated' must be true or false"):
        parse_row({**ROW, "gated": "no"}, 3)


def test_relu2_experts_reach_the_fused_moe_call_ungated(tmp_path):
    from transformers import AutoConfig
    AutoConfig.for_model("nemotron_h").to_json_file(str(tmp_path / "config.json"))
    t = trace(resolve_model(str(tmp_path)), Request(2, 1, 64, decode=True), TraceOptions(dtype="bf16"))
    experts = [op.experts for op in t.ops if op.experts is not None]
    assert experts and not any(w.gated for w in experts)
    calls = [k.moe for k in build_kernels(t, "engine") if k.moe is not None]
    assert calls and not any(c.gated for c in calls)
