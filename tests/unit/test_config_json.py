"""engine_proc/model/config_json.py reads what transformers reads, for every field the native runner uses, or
leaves the file to transformers."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoConfig, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

from rill.bench.serving.tiny_model import write_tiny_model
from rill.engine_proc.attention.kv_layout import head_dim_of, num_kv_heads_of
from rill.engine_proc.model.config_json import DEFAULTS, NULLABLE, JsonConfig, read_config_json
from rill.engine_proc.model.llama import check_supported
from rill.engine_proc.model.loader import load_config
from rill.engine_proc.model.rope import rope_parameters

ROOT = Path(__file__).resolve().parents[2]
# Every config field the native runner, its KV cache, tensor parallelism, LoRA and the engine's start read.
FIELDS = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
          "tie_word_embeddings", "attention_bias", "mlp_bias", "sliding_window", "use_sliding_window", "layer_types",
          "no_rope_layers", "pad_token_id", "bos_token_id", "eos_token_id", "initializer_range", "attention_multiplier",
          "embedding_multiplier", "residual_multiplier", "logits_scaling", "final_logit_softcapping",
          "partial_rotary_factor", "quantization_config")
CLASSES = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}
SHAPE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256)
ABSENT = object()


def _write(tmp_path: Path, config: dict) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def _saved(tmp_path: Path, family: str, **fields) -> Path:
    """The config.json transformers' save_pretrained writes (only what differs from the defaults)."""
    CLASSES[family](**fields).save_pretrained(tmp_path)
    return tmp_path


def _same_reading(model_dir: Path) -> JsonConfig:
    ours, theirs = read_config_json(model_dir), AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    assert ours is not None, "read by transformers instead"
    for name in FIELDS:
        assert getattr(ours, name, ABSENT) == getattr(theirs, name, ABSENT), name
    assert head_dim_of(ours) == head_dim_of(theirs) and num_kv_heads_of(ours) == num_kv_heads_of(theirs)
    assert rope_parameters(ours) == rope_parameters(theirs)
    assert ours.get_text_config() is ours
    return ours


@pytest.mark.parametrize("family", sorted(DEFAULTS))
def test_a_file_of_the_model_type_alone_takes_transformers_defaults(tmp_path, family):
    ours = _same_reading(_write(tmp_path, {"model_type": family}))
    assert ours.hidden_size == 4096


@pytest.mark.parametrize("family", sorted(DEFAULTS))
def test_what_save_pretrained_writes(tmp_path, family):
    ours = _same_reading(_saved(tmp_path, family, **SHAPE, tie_word_embeddings=True, rms_norm_eps=1e-5))
    assert (ours.num_hidden_layers, ours.tie_word_embeddings) == (3, True)


@pytest.mark.parametrize("family", sorted(DEFAULTS))
def test_nulls_and_the_older_rope_theta_take_what_transformers_derives(tmp_path, family):
    nulls = dict.fromkeys(NULLABLE[family])
    config = {"model_type": family, **SHAPE, **nulls, "rope_theta": 123456.0, "rope_scaling": None, "sliding_window": None}
    ours = _same_reading(_write(tmp_path, config))
    assert rope_parameters(ours)["rope_theta"] == 123456.0
    assert head_dim_of(ours) == (128 if family == "qwen3" else 16)  # Qwen3 defaults to 128, the others derive it
    if "num_key_value_heads" in nulls:
        assert num_kv_heads_of(ours) == 4


@pytest.mark.parametrize(("family", "field"), [("mistral", "num_key_value_heads"), ("qwen3", "head_dim"),
                                               ("llama", "hidden_size")])
def test_a_null_transformers_refuses_is_left_to_it(tmp_path, family, field):
    model_dir = _write(tmp_path, {"model_type": family, **SHAPE, field: None})
    assert read_config_json(model_dir) is None
    with pytest.raises(Exception, match=field):
        AutoConfig.from_pretrained(str(model_dir), local_files_only=True)


# As the hub's Qwen2.5-0.5B-Instruct and Mistral-7B-Instruct-v0.3 ship them (their shapes cut down).
QWEN25 = {"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645,
          "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 96,
          "max_position_embeddings": 32768, "max_window_layers": 21, "model_type": "qwen2", "num_attention_heads": 4,
          "num_hidden_layers": 3, "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
          "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
          "transformers_version": "4.43.1", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}
MISTRAL_V03 = {"architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
               "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 96,
               "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 4,
               "num_hidden_layers": 3, "num_key_value_heads": 2, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
               "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
               "transformers_version": "4.42.0.dev0", "use_cache": True, "vocab_size": 32768}


@pytest.mark.parametrize("config", [QWEN25, MISTRAL_V03], ids=["qwen2.5", "mistral-v0.3"])
def test_configs_as_the_hub_ships_them(tmp_path, config):
    ours = _same_reading(_write(tmp_path, config))
    assert ours.sliding_window is None and rope_parameters(ours)["rope_theta"] == 1000000.0
    check_supported(ours)


def test_mistrals_default_window_is_kept_for_the_native_runner_to_refuse(tmp_path):
    ours = _same_reading(_write(tmp_path, {"model_type": "mistral", **SHAPE, "max_position_embeddings": 8192}))
    assert ours.sliding_window == 4096
    with pytest.raises(ValueError, match="sliding-window"):
        check_supported(ours)


def test_the_bundled_model_and_the_tiny_one(model_dir, tmp_path):
    _same_reading(model_dir)
    assert load_config(model_dir).__class__ is JsonConfig
    _same_reading(write_tiny_model(tmp_path / "tiny"))


@pytest.mark.parametrize("change", [
    {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},  # transformers takes max_position_embeddings for it
    {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "truncate": 1}},
    {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                      "attention_factor": None}},
    {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
    {"rope_scaling": {"rope_type": "linear", "factor": "2"}},
    {"rope_scaling": {"rope_type": "linear", "factor": 2.0, "original_max_position_embeddings": 64}},
    {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}},
    {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 64}},
    {"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "rope_parameters": {"rope_type": "linear", "factor": 3.0}},
    {"partial_rotary_factor": 0.5},
    {"quantization_config": {"quant_method": "gptq", "bits": 4}},
    {"model_type": "qwen2", "use_sliding_window": True},
    {"model_type": "qwen3", "layer_types": ["full_attention", "sliding_attention", "full_attention"]},
    {"model_type": "granite"},
    {"hidden_size": 66},  # not a multiple of the heads: transformers refuses it, saying so
    {"hidden_size": "64"},
    {"num_hidden_layers": True},
])
def test_anything_else_is_left_to_transformers(tmp_path, change):
    model_dir = _write(tmp_path, {"model_type": "llama", **SHAPE, **change})
    assert read_config_json(model_dir) is None


def test_the_llama_3_2_1b_shape_in_the_repository():
    """Its llama3 RoPE scaling is read here too (engine_proc/model/rope.py computes it: tests/unit/test_rope.py)."""
    model_dir = ROOT / "bench" / "models" / "llama-3.2-1b"
    ours = _same_reading(model_dir)
    assert load_config(model_dir).__class__ is JsonConfig and ours.rope_parameters["rope_type"] == "llama3"
    check_supported(ours)


@pytest.mark.parametrize("rope", [
    {"rope_type": "linear", "factor": 2.0}, {"rope_type": "linear", "factor": 4},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    {"rope_type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
     "mscale": 1.0, "mscale_all_dim": 1.0, "truncate": False},
    {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
])
@pytest.mark.parametrize("written", ["rope_scaling", "rope_parameters"])
def test_scalings_read_as_transformers_reads_them(tmp_path, rope, written):
    """The older file (rope_scaling, rope_theta beside it) and transformers 5's (rope_parameters holding rope_theta)."""
    config = {"model_type": "llama", **SHAPE}
    if written == "rope_scaling":
        config.update(rope_scaling=rope, rope_theta=500000.0)
    else:
        config.update(rope_parameters={**rope, "rope_theta": 500000.0})
    ours = _same_reading(_write(tmp_path, config))
    assert ours.rope_parameters == {**rope, "rope_theta": 500000.0, "rope_type": rope.get("rope_type", rope.get("type"))}
