"""Compiled prompt steps (engine_proc/model/compiled_prefill.py) against the eager runner.

On a GPU the runner compiles them itself (the GPU tier); without one the same graph runs on the CPU
through AOTAutograd without Inductor, the Triton kernels under Triton's interpreter (conftest.py
turns it on): the tracing, its unbacked dimensions and the opaque attention op are the GPU's.
"""
from __future__ import annotations

import random

import pytest
import torch

from rill.engine_proc.model.compiled_prefill import CompiledPrefill
from tests.helpers.generation import BLOCK_SIZE, step_logits
from tests.helpers.runners import make_runner

pytest.importorskip("triton", reason="triton is not installed (pip install -e .[test] on Linux)")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_compiled_prompt_steps_match_the_eager_runner(tiny_model_dir):
    import torch._dynamo.utils

    rng = random.Random(2)
    prompts = [[rng.randrange(3, 128) for _ in range(n)] for n in (20, 37, 9, 3)]
    make = lambda **kw: make_runner(tiny_model_dir, num_kv_blocks=32, block_size=BLOCK_SIZE,  # noqa: E731
                                    eos_token_ids=[2], device=DEVICE, attention_backend="triton", **kw)
    eager = make()
    compiled = make(compile_decode=DEVICE == "cuda")  # on a GPU the runner builds it; here the test does
    if compiled.compiled_prefill is None:
        assert DEVICE == "cpu", "torch.compile failed on the GPU: see the warning in the log"
        # The same graph without Inductor, whose CPU lowering of linears refuses unbacked sizes (on a
        # GPU the matmuls are cuBLAS's): the tracing, the unbacked dimensions and the op are checked.
        compiled.compiled_prefill = CompiledPrefill(compiled.model, compiled.kv_cache, compiled.device, "aot_eager")
        compiled.compiled_prefill.warm_up()
    compiled.prompt_graphs = None  # on a GPU: the compiled step itself, not its CUDA graphs (test_prompt_graphs.py)
    graphs_after_warm_up = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    calls = []
    run = compiled.compiled_prefill.run
    compiled.compiled_prefill.run = lambda *args: calls.append(args[0].shape[0]) or run(*args)
    # Chunks of 16 mixed with decodes as requests arrive: steps of 20, 33, 27, 23 and 5 tokens, ...
    got, got_tokens = step_logits(compiled, prompts, chunk_len=16, num_steps=6)
    want, want_tokens = step_logits(eager, prompts, chunk_len=16, num_steps=6)
    for step, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4, msg=f"step {step}")
    assert got_tokens == want_tokens
    assert len(set(calls)) >= 3  # prompt steps of several sizes went through the compiled graph
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs_after_warm_up  # none compiled since
