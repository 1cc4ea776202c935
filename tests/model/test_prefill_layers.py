"""Prompt steps' layers as one C++ operator each (engine_proc/kernels/prefill_layer.py): taken for
steps of fresh prompts on the AMX path, with the bits of the Python layers; not taken otherwise.

It runs only where the CPU has AMX-BF16 (elsewhere the operator never applies)."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from rill.engine_proc.kernels import extension
from rill.engine_proc.sched.batch import Batch, ScheduledSeq
from rill.engine_proc.sched.request import EngineRequest
from rill.ipc.protocol import SamplingParams
from tests.helpers.generation import BlockAllocator
from tests.helpers.runners import make_runner

pytestmark = pytest.mark.skipif(not (extension.available() and torch.ops.rill_cpu.amx_linear_supported()),
                                reason="no AMX-BF16 on this CPU (or no built kernels): the Python layers serve")

# Heads of 64 and whole 64-column panels, as the operator needs; two layers.
TINY = dict(vocab_size=128, hidden_size=256, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512)  # fmt: skip


@pytest.fixture(scope="module", params=["llama", "qwen2"])  # qwen2: biased q, k and v
def runner(request, tmp_path_factory):
    torch.manual_seed(0)
    config = LlamaConfig(**TINY) if request.param == "llama" else Qwen2Config(**TINY, tie_word_embeddings=True)
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for param in hf.parameters():
            param.normal_(0.0, 0.2)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return make_runner(path, dtype=torch.bfloat16, num_kv_blocks=64, block_size=16, eos_token_ids=[2])


def requests(runner, lens):
    gen = torch.Generator().manual_seed(sum(lens))
    reqs = [EngineRequest(f"r{i}", "w", torch.randint(3, 128, (n,), generator=gen).tolist(), SamplingParams(max_tokens=1))
            for i, n in enumerate(lens)]
    allocator = BlockAllocator(runner.kv_cache.num_blocks, seed=1)
    for req in reqs:
        allocator.cover(req, req.num_tokens)
    return reqs


def logits_both_ways(runner, batch_of):
    """(logits, Python layer calls) through the operator where it applies, then forced through the
    Python layers, each on a fresh batch from batch_of()."""
    model, calls = runner.model, []
    hook = model.layers[0].register_forward_hook(lambda *args: calls.append(1))
    try:
        model.prefill_layer_args = None  # rebuilt from the layers
        fast, fast_calls = runner.compute_logits(batch_of()), len(calls)
        model.prefill_layer_args = [None] * len(model.layers)  # no layer can take it: the Python path
        slow = runner.compute_logits(batch_of())
    finally:
        model.prefill_layer_args = None
        hook.remove()
    return fast, fast_calls, slow, len(calls) - fast_calls


@pytest.mark.parametrize("lens", [[200], [70, 33, 129]])
def test_fresh_prompts_take_the_operator_with_the_bits_of_the_layers(runner, lens):
    reqs = requests(runner, lens)
    fast, fast_calls, slow, slow_calls = logits_both_ways(
        runner, lambda: Batch([ScheduledSeq(r, 0, r.num_tokens) for r in reqs]))
    assert (fast_calls, slow_calls) == (0, 1)
    assert fast.shape == (len(lens), 128) and torch.equal(fast, slow)


def test_a_chunk_on_cached_tokens_takes_the_python_layers(runner):
    (req,) = requests(runner, [90])
    runner.compute_logits(Batch([ScheduledSeq(req, 0, 50)]))  # the first 50 tokens into the cache
    _, fast_calls, _, _ = logits_both_ways(runner, lambda: Batch([ScheduledSeq(req, 50, 40)]))
    assert fast_calls == 1


def test_lora_layers_take_the_python_path(runner, tmp_path):
    """With --enable-lora every projection is a LoRALinear (per-row adapters): a fresh prompt must
    not go around them through the operator, even after a prompt took it before they were wrapped."""
    from rill.engine_proc.lora.layers import LoRAState, wrap_linears

    model = runner.model
    (req,) = requests(runner, [60])
    runner.compute_logits(Batch([ScheduledSeq(req, 0, req.num_tokens)]))
    assert model.prefill_layer_args is not None and all(a is not None for a in model.prefill_layer_args)
    originals = [(layer.attn.qkv_proj, layer.attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
                 for layer in model.layers]
    wrap_linears(model, LoRAState(), max_loras=1, max_rank=8, device="cpu")
    calls = []
    hook = model.layers[0].register_forward_hook(lambda *args: calls.append(1))
    try:
        runner.compute_logits(Batch([ScheduledSeq(req, 0, req.num_tokens)]))
    finally:
        hook.remove()
        for layer, (qkv, o, gate_up, down) in zip(model.layers, originals):
            layer.attn.qkv_proj, layer.attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj = qkv, o, gate_up, down
        model.all_rows_to_the_end = False
        model.bind_kernels()  # the kernel paths of the unwrapped layers
    assert calls == [1]
