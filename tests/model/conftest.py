"""The model tests' shared fixtures: the bundled model's prompts, transformers' greedy tokens for them
and a float32 runner, each built once per session; the bundled model cut to its first layers."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rill.engine_proc.kernels import extension
from rill.engine_proc.model.bundled import ensure_bundled_model
from rill.engine_proc.model.runner import ModelRunner
from tests.helpers.generation import BLOCK_SIZE, EOS_ID, MESSAGES, hf_greedy
from tests.helpers.runners import make_runner
from tests.helpers.tiny_models import save_tiny_model
from tests.helpers.truncated_model import write_truncated_model

SHORT_LAYERS = 4


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return ensure_bundled_model()


@pytest.fixture(scope="session")
def short_model_dir(model_dir, tmp_path_factory) -> Path:
    """The bundled model's first SHORT_LAYERS decoder layers, its embedding and head: every operator and shape
    of the whole model's layers, at a seventh of the cost, for tests of how the model is run (compiled graphs,
    batch invariance), not of what it answers."""
    return write_truncated_model(model_dir, tmp_path_factory.mktemp("short"), SHORT_LAYERS)


@pytest.fixture(scope="session")
def short_runner(short_model_dir) -> ModelRunner:
    """A float32 runner of `short_model_dir`, as `runner` is of the whole model."""
    return make_runner(short_model_dir, dtype=torch.float32, num_kv_blocks=64, block_size=BLOCK_SIZE,
                       eos_token_ids=[EOS_ID])


@pytest.fixture(scope="session")
def prompts(model_dir) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [
        list(tokenizer.apply_chat_template([{"role": "user", "content": m}], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])
        for m in MESSAGES
    ]


@pytest.fixture(scope="session")
def hf_model(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def hf_tokens(hf_model, prompts) -> list[list[int]]:
    """transformers' greedy continuation; min_new_tokens holds eos back as min_tokens does."""
    return hf_greedy(hf_model, prompts)


@pytest.fixture(scope="session")
def runner(model_dir) -> ModelRunner:
    return make_runner(model_dir, dtype=torch.float32, num_kv_blocks=64, block_size=BLOCK_SIZE, eos_token_ids=[EOS_ID])


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-qwen2")
    save_tiny_model("qwen2", path)
    return path


@pytest.fixture(params=["amx_tiles", "brgemm"])
def panels_kernel(request) -> str:
    """Each kernel of the quantized layers' products above their GEMV's rows (csrc/quant_panels.cpp) that this CPU
    and build run, switched on for the test: AMX's tiles (quant_tiles.h), else brgemm over the panels."""
    default = torch.ops.rill_cpu.quant_panels_kernel() if extension.available() else "none"
    if default == "none":
        pytest.skip("the panels need a build with AVX-512 BF16")
    if request.param == "amx_tiles" and default != "amx_tiles":
        pytest.skip("AMX's tiles: not on this CPU or build")
    torch.ops.rill_cpu.quant_panels_kernel(request.param)
    yield request.param
    torch.ops.rill_cpu.quant_panels_kernel(default)
