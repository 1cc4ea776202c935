"""engine_proc/model/rope.py's own frequencies (the default, the linear, Llama 3.x's and YaRN scalings) are
transformers', bit for bit, with YaRN's attention factor, read from a config.json by engine_proc/model/config_json.py
as by transformers."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from rill.engine_proc.model.config_json import JsonConfig, read_config_json
from rill.engine_proc.model.rope import rope_inv_freq

LLAMA_3_1 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
             "original_max_position_embeddings": 8192}
LLAMA_3_2 = {**LLAMA_3_1, "factor": 32.0}
QWEN_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}  # Qwen3's long context


@pytest.mark.parametrize("head_dim, theta, scaling", [
    (128, 500000.0, LLAMA_3_1), (64, 500000.0, LLAMA_3_2), (64, 10000.0, {**LLAMA_3_1, "high_freq_factor": 2}),
    (128, 500000.0, {**LLAMA_3_1, "original_max_position_embeddings": 2048}),
    (64, 10000.0, {"rope_type": "linear", "factor": 2.0}), (128, 1000000.0, {"rope_type": "linear", "factor": 4}),
    (64, 10000.0, None), (128, 500000.0, None),
    (128, 1000000.0, QWEN_YARN), (64, 10000.0, {**QWEN_YARN, "factor": 2.0, "original_max_position_embeddings": 2048}),
    (128, 10000.0, {**QWEN_YARN, "beta_fast": 16, "beta_slow": 2.0, "truncate": False}),
    (64, 10000.0, {**QWEN_YARN, "factor": 40, "mscale": 1.0, "mscale_all_dim": 0.707}),
    (128, 10000.0, {**QWEN_YARN, "attention_factor": 1.25}),
    (128, 1000000.0, {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
    (64, 10000.0, {"type": "linear", "factor": 2.0}),
], ids=["llama3.1", "llama3.2", "llama3-high-2", "llama3-short-context", "linear-2", "linear-4", "default",
        "default-500k", "yarn-qwen3", "yarn-2", "yarn-betas-untruncated", "yarn-deepseek-mscale", "yarn-attention",
        "yarn-older-type-key", "linear-older-type-key"])
def test_the_frequencies_are_transformers(tmp_path, head_dim, theta, scaling):
    config = {"model_type": "llama", "hidden_size": head_dim * 4, "num_attention_heads": 4, "head_dim": head_dim,
              "num_hidden_layers": 2, "intermediate_size": 64, "vocab_size": 128, "max_position_embeddings": 131072,
              "rope_theta": theta, **({"rope_scaling": scaling} if scaling else {})}
    (tmp_path / "config.json").write_text(json.dumps(config))
    ours = read_config_json(tmp_path)
    assert isinstance(ours, JsonConfig), "left to transformers"
    theirs = AutoConfig.from_pretrained(str(tmp_path), local_files_only=True)
    rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    expected, factor = ROPE_INIT_FUNCTIONS[rope_type](theirs, torch.device("cpu")) if rope_type != "default" else \
        (1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)), 1.0)
    got, got_factor = rope_inv_freq(ours)
    assert got.dtype == torch.float32 and torch.equal(got, expected.float()) and got_factor == factor
    with torch.device("meta"):  # as the model is built: the frequencies are still real numbers
        assert torch.equal(rope_inv_freq(ours)[0], got)
    if rope_type != "default":
        assert not torch.equal(got, rope_inv_freq(JsonConfig(**{**vars(ours), "rope_parameters": {
            "rope_theta": theta, "rope_type": "default"}}))[0])  # the scaling changed them
