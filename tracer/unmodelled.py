"""Model types tracecost knows it cannot trace as a serving step, each with what is not modelled, in plain words.

Without an entry such a model fails inside transformers' forward, and the one-line error (tracer/trace.py) names a
module and quotes transformers, which does not say what tracecost does not model. The reasons cite the modeling
file of transformers 5.17-5.24 where the step's structure shows.
"""
from __future__ import annotations

UNMODELLED = {
    # transformers/models/blt/modeling_blt.py: BltModel.forward runs the patcher (an entropy model) on the input
    # bytes to cut them into patches, and builds its cross-attention cache with DynamicCache(config=...), which reads
    # a layer count BltConfig does not have (it keeps them in encoder_config, global_config and decoder_config)
    "blt": "byte-patch models are not modelled: BLT's global transformer runs over patches of bytes that an entropy "
           "model cuts from the bytes' values (a step's work is not set by its token counts), and transformers "
           "cannot run BLT with a KV cache",
    # transformers/models/prophetnet/modeling_prophetnet.py: ProphetNetDecoder.forward asserts "use_cache is only
    # supported for decoder_input_ids of length 1" once a cache holds tokens
    "prophetnet": "n-gram prediction streams are not modelled: ProphetNet's decoder predicts several future tokens "
                  "per step, and transformers runs it over a KV cache only one token at a time, so a prompt over "
                  "cached tokens has no forward to trace",
    # transformers 5.24 models/gemma4_unified_assistant/modeling_gemma4_unified_assistant.py: the forward raises
    # "inputs_embeds and shared_kv_states cannot be None" (the target model's hidden states and KV states)
    "gemma4_unified_assistant": "assistant models that attend to their target model's KV cache are not modelled: "
                                "Gemma-4's unified assistant runs on the target's hidden states and shared KV "
                                "states, not on tokens and a cache of its own, so it has no step of its own to trace",
}


def refusal(model_type: str | None) -> str | None:
    """What is not modelled in this model type, or None."""
    return UNMODELLED.get(model_type or "")


__all__ = ["UNMODELLED", "refusal"]
