"""RoPE scalings that depend on the sequence's length on the transformers route
(engine_proc/model/hf_rope.py): LongRoPE's factors chosen for the server, dynamic NTK per sequence."""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from rill.engine_proc.model.hf_paged import PagedTransformersRunner
from tests.helpers.runners import make_runner
from tests.helpers.scheduled import (
    BLOCK_SIZE,
    EOS_ID,
    NUM_NEW_TOKENS,
    PROMPTS,
    hf_continuations,
    outputs,
    run_scheduled,
)
from tests.helpers.tiny_models import ROPE_SWITCH, save_tiny_model


def always_long(hf):
    """transformers' model with its LongRoPE short factors replaced by the long ones: what it computes
    for a sequence past the original context (its generate recomputes the sequence when it crosses)."""
    config = copy.deepcopy(hf.config)
    config.rope_parameters["short_factor"] = list(config.rope_parameters["long_factor"])
    twin = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    twin.load_state_dict(hf.state_dict())
    return twin


@pytest.mark.parametrize("compiled", [False])  # its frequencies are fixed: the compiled step is the dynamic test's
def test_longrope_takes_the_long_factors_for_a_long_context(compiled, tmp_path):
    """Phi-4-mini's LongRoPE (3/4 rotary; engine_proc/model/hf_rope.py) served with a context longer
    than its original: the long factors for every sequence, whatever else the step holds, through
    chunked prefill and a prefix-cache hit; "a", past the original context from its prompt on, gets
    transformers' own generate."""
    hf = save_tiny_model("phi4-mini-longrope", tmp_path)
    runner = make_runner(tmp_path, runner_class=PagedTransformersRunner, num_kv_blocks=64, block_size=BLOCK_SIZE,
                         eos_token_ids=[EOS_ID], compile_decode=compiled, max_num_seqs=8)
    assert not compiled or runner.decode_graphs is not None
    long = always_long(hf)
    reqs = run_scheduled(runner, long, {"a": 0, "b": 0, "c": 2, "a2": 6}, max_num_batched_tokens=7, caching=True)
    assert outputs(reqs) == hf_continuations(long)
    assert reqs["a"].output_ids == hf_continuations(hf)["a"] and len(PROMPTS["a"]) > ROPE_SWITCH


def test_longrope_takes_the_short_factors_within_the_original_context(tmp_path):
    """--max-model-len at most the original context: the short factors, transformers' own results."""
    hf = save_tiny_model("phi4-mini-longrope", tmp_path)
    runner = make_runner(tmp_path, runner_class=PagedTransformersRunner, num_kv_blocks=64, block_size=BLOCK_SIZE,
                         eos_token_ids=[EOS_ID], max_model_len=ROPE_SWITCH)
    assert len(PROMPTS["b"]) + NUM_NEW_TOKENS <= ROPE_SWITCH
    reqs = run_scheduled(runner, hf, {"b": 0})
    assert outputs(reqs) == {"b": hf_continuations(hf)["b"]}


@pytest.mark.parametrize("compiled", [False, True])
def test_dynamic_rope_follows_each_sequence(compiled, tmp_path):
    """Dynamic NTK, batched (engine_proc/model/hf_rope.py): each sequence's base follows its own length,
    as transformers' generate gives it alone. "b" stays under ROPE_SWITCH tokens, "a" starts past it,
    "c" crosses it while it decodes; every sampled row's logits are generate's for that sequence alone
    (its cache keeps the rotation it was written with, so a forward over the whole sequence is no
    reference here)."""
    hf = save_tiny_model("llama-dynamic", tmp_path)
    runner = make_runner(tmp_path, runner_class=PagedTransformersRunner, num_kv_blocks=64, block_size=BLOCK_SIZE,
                         eos_token_ids=[EOS_ID], compile_decode=compiled, max_num_seqs=8)
    assert not compiled or runner.decode_graphs is not None
    generated = {}
    with torch.inference_mode():
        for name in "abc":
            out = hf.generate(torch.tensor([PROMPTS[name]]), max_new_tokens=NUM_NEW_TOKENS, do_sample=False,
                              min_new_tokens=NUM_NEW_TOKENS, pad_token_id=0, output_logits=True,
                              return_dict_in_generate=True)
            generated[name] = (out.sequences[0, len(PROMPTS[name]):].tolist(), [step[0] for step in out.logits])
    assert len(PROMPTS["b"]) + NUM_NEW_TOKENS < ROPE_SWITCH < len(PROMPTS["c"]) + NUM_NEW_TOKENS
    reqs = run_scheduled(runner, hf, {"a": 0, "b": 0, "c": 0}, reference=lambda name, i: generated[name][1][i])
    assert outputs(reqs) == {name: tokens for name, (tokens, _) in generated.items()}
