"""Issue 23 item 4: valid configs the checks refused (per-layer lists, renamed layer counts, head_dim 0) are
accepted, and degenerate values in the same fields are still refused."""
import pytest

from tracer.config_checks import ConfigError, check_model_config, model_dims, text_config

LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100}


@pytest.mark.parametrize("config, layers", [
    ({"layers_block_type": ["mamba", "moe", "attention", "mlp"], "hidden_size": 64}, 4),      # nemotron_h
    ({"hybrid_override_pattern": "M-M*", "hidden_size": 64}, 4),
    ({"num_decoder_layers": 12, "num_encoder_layers": 12, "hidden_size": 64}, 12),            # prophetnet
    ({"text_config": {"layers": 24, "embed_dim": 64}}, 24),                                   # kosmos-2
    ({"decoder": {"num_hidden_layers": 26, "num_attention_heads": 8}, "encoder": {}}, 26),   # t5gemma2, musicgen
    ({"global_config": {"num_hidden_layers": 25}, "decoder_config": {"num_hidden_layers": 9}}, 25),   # blt
    ({"vlm_config": {"text_config": {"num_hidden_layers": 18}}}, 18),                        # pi0
])
def test_renamed_layer_counts_are_found(config, layers):
    assert check_model_config(config).layers == layers


def test_a_sub_config_gives_the_attention_facts():
    config = {"decoder": {"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2}}
    assert text_config(config) is config["decoder"]
    assert (model_dims(config).heads, model_dims(config).kv_heads) == (8, 2)
    top = {**LLAMA, "decoder": {"num_hidden_layers": 9}}     # a top-level count wins over a sub-config
    assert model_dims(top).layers == 2


def test_layers_as_a_list_of_modules_is_not_a_count():
    with pytest.raises(ConfigError, match="no layer count"):
        check_model_config({"layers": [{"type": "attention"}], "hidden_size": 64})


def test_per_layer_sizes_and_zero_head_dim_accepted():
    check_model_config({**LLAMA, "intermediate_size": [128, 256]})                  # gemma3n
    check_model_config({**LLAMA, "moe_intermediate_size": [1536, 512]})             # ernie4_5_vl_moe
    check_model_config({**LLAMA, "head_dim": 0, "qk_rope_head_dim": 0, "kv_lora_rank": 8})   # glm5_next


@pytest.mark.parametrize("edit, field", [
    ({"intermediate_size": [128, 0]}, "intermediate_size"),
    ({"intermediate_size": [128, "big"]}, "intermediate_size"),
    ({"head_dim": -1}, "head_dim"),
    ({"vocab_size": 0}, "vocab_size"),
    ({"num_hidden_layers": None, "layers_block_type": ["mamba"] * 5000}, "layers_block_type"),
])
def test_degenerate_values_still_refused(edit, field):
    with pytest.raises(ConfigError, match=field):
        check_model_config({**LLAMA, **edit})
