"""vLLM schedules asynchronously from 0.14 on (cost/engines.py AsyncScheduling): the scheduler's host work of a step
runs while the GPU computes the step before, except with draft-model and n-gram speculation and with pipeline
parallelism; the releases before fitted that work in series."""
import pytest

from cost.engines import ENGINES, engine_releases, scheduled_ahead
from cost.profile import load_profile
from serving.published_rows import stated_release
from serving.speculative import parse_speculation, speculative_step, step_times
from serving.step_cost import ASYNC_NOTE, StepCost
from tracer import TraceOptions, resolve_model


def _cost(release: str | None, model: str = "llama-3.1-8b", pp: int = 1) -> StepCost:
    from cost.estimate import Parallelism
    return StepCost(resolve_model(model), load_profile("l40s"), TraceOptions(), "engine", Parallelism(1, pp=pp),
                    "vllm", release=release)


@pytest.mark.parametrize("engine, release, pp, method, expected", [
    ("vllm", "0.14", 1, None, True), ("vllm", "0.15", 1, "eagle3", True), ("vllm", "0.14", 1, "mtp", True),
    ("vllm", "0.13", 1, None, False), ("vllm", "0.11", 1, None, False), ("vllm", "0.14", 2, None, False),
    ("vllm", "0.14", 1, "draft", False), ("vllm", "0.14", 1, "ngram", False),
    ("sglang", "0.5", 1, None, False), ("trtllm", "1.2", 1, None, False)])
def test_which_releases_and_setups_schedule_ahead(engine, release, pp, method, expected):
    assert scheduled_ahead(engine, release, pp, method) is expected


def test_the_newest_vllm_release_with_data_schedules_ahead_and_says_so():
    assert engine_releases("vllm")[-1] == "0.14" and scheduled_ahead("vllm", None)
    newest = _cost(None)
    assert newest.async_scheduling and ASYNC_NOTE in newest.overhead_origin
    assert not _cost("0.11").async_scheduling and ASYNC_NOTE not in _cost("0.11").overhead_origin
    assert "0.14.0 release notes" in ENGINES["vllm"].async_scheduling.source


def test_host_work_hides_under_a_step_that_outlasts_it():
    """A 70B decode of 32 requests takes tens of ms on the GPU, the scheduler's host work a few: at 0.14 the step
    loses exactly that host work against 0.11 (the same kernels and the same fitted terms)."""
    old, new = _cost("0.11", "llama-3.1-70b"), _cost("0.14", "llama-3.1-70b")
    o = old.overheads
    assert o == new.overheads
    host = (o.step_us + o.seq_us * 32) * 1e-6
    t_old, t_new = old.steady(32, 0, 1, 0, 1000), new.steady(32, 0, 1, 0, 1000)
    assert t_old - t_new == pytest.approx(host, rel=1e-9)
    assert t_new > 10 * host


def test_host_work_longer_than_the_step_still_bounds_it():
    """A small model's step at a large batch is shorter than its scheduler's work: only the GPU's step hides."""
    old, new = _cost("0.11", "llama-3.2-1b"), _cost("0.14", "llama-3.2-1b")
    o = new.overheads
    host = (o.step_us + o.seq_us * 512) * 1e-6
    t_old, t_new = old.steady(512, 0, 1, 0, 300), new.steady(512, 0, 1, 0, 300)
    assert host < t_new < t_old
    assert t_old - t_new < host


def test_pipeline_stages_keep_the_host_work_in_series():
    assert not _cost("0.14", pp=2).async_scheduling


def test_a_draft_model_turns_it_off_for_the_speculative_step_only():
    target = _cost("0.14", "llama-3.1-70b")
    draft = speculative_step(target, parse_speculation("draft:llama-3.2-1b", 4, acceptance_rate=0.7))
    eagle = speculative_step(_cost("0.14", "llama-3.1-70b"), parse_speculation("eagle3", 4, acceptance_rate=0.7))
    assert draft.host_in_series and not eagle.host_in_series
    assert any("does not schedule asynchronously when it speculates with a draft model" in n for n in draft.formats_notes())
    o = target.overheads
    t = step_times(draft, 16, 800)
    in_series = draft.steady(16, 0, 1, 0, 800)
    draft.host_in_series = False
    assert in_series - draft.steady(16, 0, 1, 0, 800) == pytest.approx((o.step_us + o.seq_us * 16) * 1e-6)
    # the plain step it is compared with schedules ahead, as vLLM does without speculating
    assert t.plain_s == pytest.approx(target.steady(16, 0, 1, 0, 800))


def test_the_pr24322_build_is_placed_on_0_14_by_its_commit():
    assert stated_release("vllm", "vLLM main @e1a34c3a5 (v0.1.dev13107, the PR #24322 branch, V1 engine)") == "0.14"
    assert stated_release("vllm", "vLLM main @0123456789 (an unknown build)") is None
