"""Issue 23 item 4: model types of the transformers sweep (bench/arch_coverage.py) that traced wrongly or were
refused although tracecost models them."""
from tracer.trace import _reads_mask_shape_unguarded

GIT_517 = '''
def forward(self, input_ids, attention_mask=None, past_key_values=None):
    if pixel_values is not None:
        if attention_mask is not None:
            attention_mask = torch.cat([ones, attention_mask], dim=-1)
    elif past_key_values is not None and seq_len == 1:
        extended = torch.ones((attention_mask.shape[0], past - attention_mask.shape[1] + 1))
'''
GIT_524 = '''
def forward(self, input_ids, attention_mask=None, cache=None):
    if pixel_values is not None:
        x = 1
    elif cache is not None and cache_length > 0 and attention_mask is not None and attention_mask.ndim == 2:
        extended = torch.ones((attention_mask.shape[0], self.image_patch_tokens))
    n = attention_mask.shape[1] if attention_mask is not None else 0
'''


def test_padding_mask_only_where_its_shape_is_read_unguarded():
    assert _reads_mask_shape_unguarded(GIT_517)        # GIT 5.17 decoding reads it: give the all-ones mask
    assert not _reads_mask_shape_unguarded(GIT_524)    # GIT 5.24 widens a given mask by image tokens: give none
    assert _reads_mask_shape_unguarded("def f(attention_mask):\n    return attention_mask.shape[0]\n")


def _default_trace(model_type, tmp_path, request):
    from transformers import AutoConfig

    from tracer import TraceOptions, trace
    from tracer.model_source import resolve_model
    AutoConfig.for_model(model_type).to_json_file(str(tmp_path / "config.json"))
    return trace(resolve_model(str(tmp_path)), request, TraceOptions(dtype="bf16"))


def test_git_traces_over_a_cached_context(tmp_path):
    from tracer import Request
    for request in (Request(2, 64, 128), Request(2, 1, 256, decode=True)):
        t = _default_trace("git", tmp_path, request)
        assert t.checks["flop_identity"].startswith("holds") and t.checks["cache"].startswith("every attention"), \
            t.checks
        keys = {op.attention.context_length + op.attention.query_length for op in t.ops if op.attention is not None}
        assert keys == {request.seq_len}


def test_a_trace_without_attention_or_recurrent_ops_is_refused():
    from tracer import Request
    from tracer.checks import context_problems
    from tracer.work import OTHER, VECTOR, Op
    elementwise = Op(name="aten.mul", op_class=OTHER, unit=VECTOR, flops=1.0, bytes_read=1.0, bytes_written=1.0,
                     dtype="bf16", module="model.layers.0.mixer", module_type="Mixer")
    assert "no attention or recurrent op" in context_problems([elementwise], Request(1, 4, 8))[0]


def test_unmodelled_types_are_refused_in_plain_words(tmp_path):
    """BLT and ProphetNet fail inside transformers' forward (an AttributeError, an assertion), Gemma-4's unified
    assistant (5.24) on inputs a text step does not have: the refusal says what tracecost does not model instead, in
    one line, before anything is built."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    import pytest

    from tracer import ModelError, Request
    from tracer.unmodelled import UNMODELLED
    for model_type, what in (("blt", "byte-patch models are not modelled"),
                             ("prophetnet", "n-gram prediction streams are not modelled")):
        folder = tmp_path / model_type
        folder.mkdir()
        with pytest.raises(ModelError) as refused:
            _default_trace(model_type, folder, Request(2, 1, 256, decode=True))
        text = str(refused.value)
        assert text.startswith("unsupported: ") and what in text and text.endswith(UNMODELLED[model_type])
        assert "\n" not in text and "Error" not in text and "module '" not in text
    from tracer.model_source import resolve_model
    from tracer.trace import trace
    assistant = {"model_type": "gemma4_unified_assistant", "hidden_size": 64, "num_hidden_layers": 2,
                 "num_attention_heads": 2, "intermediate_size": 128, "vocab_size": 100}
    (tmp_path / "config.json").write_text(json.dumps(assistant))
    with pytest.raises(ModelError, match="^unsupported: .*assistant models that attend to their target model's KV"):
        trace(resolve_model(str(tmp_path)), Request(1, 4, 0))   # a 5.24 type: refused on either side the same
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, "-m", "cli.inference.text_generate", str(tmp_path / "blt"), "--device",
                          "h100", "--query-length", "64"], cwd=root, capture_output=True, text=True)
    assert run.returncode == 2 and "byte-patch models are not modelled" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr
