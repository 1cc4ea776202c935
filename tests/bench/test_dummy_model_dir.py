"""`python -m rill.bench.kernels.dummy_model_dir`: a servable directory at a larger config's shape (the
GPU tier's 1B model), whose tokenizer covers every id of the config's vocabulary."""
from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoConfig, AutoTokenizer

from rill.bench.kernels.dummy_model_dir import make_dir
from rill.engine_proc.model.bundled import ensure_bundled_model

LLAMA_1B = Path(__file__).resolve().parents[2] / "bench" / "models" / "llama-3.2-1b"


def test_the_1b_directory_encodes_as_the_bundled_model_and_decodes_every_id(tmp_path):
    out = make_dir(LLAMA_1B, tmp_path / "llama-1b", ensure_bundled_model())
    config = AutoConfig.from_pretrained(out)
    assert (config.hidden_size, config.num_hidden_layers, config.vocab_size) == (2048, 16, 128256)
    tokenizer = AutoTokenizer.from_pretrained(out)
    bundled = AutoTokenizer.from_pretrained(ensure_bundled_model())
    assert len(tokenizer) == config.vocab_size > len(bundled)
    assert tokenizer("hello world")["input_ids"] == bundled("hello world")["input_ids"]
    assert tokenizer.decode([config.vocab_size - 1]) == f"<|pad_{config.vocab_size - 1}|>"
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == config.eos_token_id
