"""text_generate --speculative: one speculative decode step (--decode) or the step of a whole request
(--output-length): the draft's time, the verification's, the tokens a request gains per step and the effective
TPOT, beside the plain decode step of the same batch (serving/speculative.py step_times).
"""
from __future__ import annotations

from dataclasses import dataclass

from cost.estimate import Parallelism
from cost.profile import load_profile
from serving.speculative import Speculation, StepTimes, speculative_step, step_times
from serving.step_cost import StepCost
from tracer.model_source import ModelSpec
from tracer.table import format_table

from ..common import origin_notes
from .config import InputError


@dataclass(frozen=True)
class SpeculativeDecode:
    model: str
    device: str
    tp: int
    engine: str
    speculation: Speculation
    times: StepTimes
    notes: tuple[str, ...]
    origin: dict                 # where the kernel and overhead numbers come from (cost/provenance.py)

    def as_json(self) -> dict:
        return {"model": self.model, "device": self.device, "phase": "speculative_decode", "engine": self.engine,
                "tp_size": self.tp, "speculation": self.speculation.label, "speculative_step": self.times.as_json(),
                "notes": list(self.notes), "origin": self.origin}


def predict(spec: ModelSpec, device: str, batch: int, context: int, tp: int, ep: int, execution: str, options,
            engine: str, ep_style: str, release: str | None, speculation: Speculation) -> SpeculativeDecode:
    if execution != "engine":
        raise InputError("--speculative prices a serving engine's steps: use --execution engine")
    hw = load_profile(device)
    cost = speculative_step(StepCost(spec, hw, options, execution, Parallelism(tp, ep, ep_style), engine,
                                     release=release), speculation)
    notes = ["priced as serving_sim and the optimizer price a decode step (StepCost: the engine's kernels and its "
             "step overheads); the plain step is priced the same way", *cost.formats_notes()]
    return SpeculativeDecode(spec.name, hw.name, tp, engine, speculation, step_times(cost, batch, context),
                             tuple(notes), cost.origin.as_json())


def section(times: StepTimes, speculation: Speculation) -> str:
    """The speculative step's table, shared by the one-step and the whole-request outputs."""
    rows = [["draft", f"{times.draft_s * 1e3:,.3f} ms"],
            ["verify", f"{times.verify_s * 1e3:,.3f} ms ({times.verify_tokens} tokens per request)"],
            *([["host work in series", f"{times.serial_host_s * 1e3:,.3f} ms (no overlap scheduler)"]]
              if times.serial_host_s else []),
            ["step", f"{times.step_s * 1e3:,.3f} ms"],
            ["tokens per step", f"{times.tokens_per_step:.2f}"],
            ["effective TPOT", f"{times.tpot_s * 1e3:,.3f} ms"],
            ["plain decode step", f"{times.plain_s * 1e3:,.3f} ms"],
            ["speedup", f"{times.speedup:.2f}x"]]
    return format_table(["speculative step", "value"], rows,
                        title=f"{speculation.label}: batch {times.batch}, context {times.context:,}")


def render(r: SpeculativeDecode) -> str:
    first = [r.origin["headline"]] if r.origin.get("headline") else []
    lines = first + [f"{r.model} on {r.device} x{r.tp} (TP={r.tp}), {r.engine} engine", "",
                     section(r.times, r.speculation)]
    return "\n".join(lines + [f"note: {n}" for n in [*r.notes, *origin_notes(r.origin)]])
