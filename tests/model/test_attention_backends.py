"""The attention backends (engine_proc/attention/): chosen once, held by every layer, each giving the torch backend's logits."""
from __future__ import annotations

import dataclasses
import importlib.util
import os

import pytest
import torch
from transformers import LlamaConfig

from rill.engine_proc.attention import backend as backends
from rill.engine_proc.attention import cpu
from rill.engine_proc.attention.choice import create_attention_backend
from rill.engine_proc.attention.kv_cache import AttentionMetadata, KVCache
from rill.engine_proc.model.llama import LlamaForCausalLM
from rill.engine_proc.sched.batch import Batch, ScheduledSeq
from rill.engine_proc.sched.request import EngineRequest
from rill.ipc.protocol import SamplingParams

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the Triton kernel is decorated

BLOCK_SIZE = 16
# head_dim 64: the C++ prompt kernel's size, so bfloat16 steps take it where the CPU has it.
CONFIG = LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512)
needs_kernels = pytest.mark.skipif(not cpu.available(), reason="no C++ compiler: the CPU kernels are not built")
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
CPU = torch.device("cpu")


def make_backend(kind: str, dtype: torch.dtype) -> backends.AttentionBackend:
    name, _, invariant = kind.partition("+")
    return create_attention_backend(name, CPU, dtype, BLOCK_SIZE, batch_invariant=bool(invariant))


def model_with(backend, dtype, reference=None) -> LlamaForCausalLM:
    torch.manual_seed(0)
    model = LlamaForCausalLM(CONFIG, attention=backend).to(dtype).eval()
    if reference is not None:
        model.load_state_dict(reference.state_dict())
    return model


def run_steps(model: LlamaForCausalLM, backend, dtype) -> list[torch.Tensor]:
    """Two steps' logits: three fresh prompts, then a decode beside a chunk on top of cached blocks
    and a fresh prompt (every row kind each backend prepares)."""
    kv = KVCache(CONFIG, num_blocks=32, block_size=BLOCK_SIZE, dtype=dtype)
    gen = torch.Generator().manual_seed(1)
    reqs = [EngineRequest(f"r{i}", "w", torch.randint(3, 128, (n,), generator=gen).tolist(),
                          SamplingParams(max_tokens=4)) for i, n in enumerate((21, 40, 9))]
    for i, req in enumerate(reqs):  # blocks 1.., out of order
        req.block_ids = [30 - 10 * i - b for b in range(4)]
    steps = [Batch([ScheduledSeq(reqs[0], 0, 20), ScheduledSeq(reqs[1], 0, 17)]),
             Batch([ScheduledSeq(reqs[0], 20, 1), ScheduledSeq(reqs[1], 17, 23), ScheduledSeq(reqs[2], 0, 9)])]
    out = []
    with torch.inference_mode():
        for batch in steps:
            input_ids, positions, meta, logits_indices = backend.prepare(batch)
            out.append(model(input_ids, positions, meta, kv, logits_indices).float())
    return out


def test_the_metadata_holds_data_not_modes():
    names = {f.name for f in dataclasses.fields(AttentionMetadata)}
    assert not names & {"graph_decode", "cpu_kernel", "batch_invariant"}


@needs_kernels
def test_the_backend_is_chosen_once_and_every_layer_holds_it(monkeypatch):
    chosen = {kind: type(make_backend(kind, torch.bfloat16)) for kind in ("torch", "cpu", "torch+inv", "cpu+inv")}
    assert chosen == {"torch": backends.TorchBackend, "cpu": cpu.CpuBackend, "torch+inv": backends.InvariantBackend,
                      "cpu+inv": cpu.InvariantCpuBackend}
    assert type(make_backend("cpu+inv", torch.float16)) is backends.InvariantBackend  # no kernel for float16
    backend = make_backend("cpu", torch.float32)
    model = model_with(backend, torch.float32)
    assert all(layer.attn.backend is backend for layer in model.layers)
    calls = []
    monkeypatch.setattr(backend, "forward", lambda *a, real=backend.forward: calls.append(1) or real(*a))
    for name in ("create_attention_backend", "resolve_attention_backend"):  # a step decides nothing again
        monkeypatch.setattr(f"rill.engine_proc.attention.choice.{name}", lambda *a, **k: pytest.fail("chosen again"))
    run_steps(model, backend, torch.float32)
    assert len(calls) == 2 * CONFIG.num_hidden_layers


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["cpu", "torch+inv", "cpu+inv", "triton"])
def test_each_backend_gives_the_torch_backends_logits(kind, dtype):
    if kind.startswith("cpu") and not cpu.available():
        pytest.skip("no C++ compiler: the CPU kernels are not built")
    if kind == "triton":
        if importlib.util.find_spec("triton") is None:
            pytest.skip("triton is not installed")
        if dtype == torch.bfloat16:
            pytest.skip("the interpreter's bfloat16 dot is slow; float32 covers the kernel here")
    reference_backend = make_backend("torch", dtype)
    reference = model_with(reference_backend, dtype)
    backend = make_backend(kind, dtype)
    want = run_steps(reference, reference_backend, dtype)
    got = run_steps(model_with(backend, dtype, reference), backend, dtype)
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=tolerance, rtol=tolerance)
