"""The GPU path end to end: the model runner with the Triton attention kernel and the Triton sampler.

On a GPU this runs the compiled kernels; without one, conftest.py has turned on Triton's
interpreter and the same runner runs them on CPU tensors: the wiring (flat step inputs, the
kernel's per-token tables, the sampler's dispatch) is checked against the torch path either way.
"""
from __future__ import annotations

import random

import pytest
import torch

from rill.engine_proc.model.runner import resolve_attention_backend
from rill.engine_proc.sample.sampler import Sampler
from rill.engine_proc.sched.batch import ScheduledSeq
from rill.engine_proc.sched.request import EngineRequest
from rill.ipc.protocol import SamplingParams
from tests.helpers.generation import BLOCK_SIZE, step_logits
from tests.helpers.runners import make_runner

pytest.importorskip("triton", reason="triton is not installed (pip install -e .[test] on Linux)")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_auto_picks_triton_on_a_gpu_and_a_cpu_path_on_the_cpu():
    assert resolve_attention_backend("auto", torch.device("cuda")) == "triton"
    assert resolve_attention_backend("auto", torch.device("cpu")) in ("cpu", "torch")  # cpu: see test_cpu_attention
    with pytest.raises(ValueError, match="runs on the CPU"):
        resolve_attention_backend("cpu", torch.device("cuda"))
    with pytest.raises(ValueError, match="flash"):
        resolve_attention_backend("flash", torch.device("cpu"))


def test_triton_attention_runner_matches_the_torch_runner(tiny_model_dir):
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 128) for _ in range(n)] for n in (20, 37, 9)]
    make = lambda backend: make_runner(tiny_model_dir, num_kv_blocks=24, block_size=BLOCK_SIZE,  # noqa: E731
                                       eos_token_ids=[2], device=DEVICE, attention_backend=backend)
    triton_runner, torch_runner = make("triton"), make("torch")
    assert triton_runner.attention_backend == "triton" and torch_runner.attention_backend == "torch"
    got, got_tokens = step_logits(triton_runner, prompts, chunk_len=16, num_steps=5)
    want, want_tokens = step_logits(torch_runner, prompts, chunk_len=16, num_steps=5)
    assert [len(g) for g in got] == [len(w) for w in want]
    for step, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4, msg=f"step {step}")
    assert got_tokens == want_tokens


def test_batch_invariant_mode_refuses_the_triton_path(tiny_model_dir):
    with pytest.raises(ValueError, match="batch-invariant"):
        make_runner(tiny_model_dir, num_kv_blocks=4, eos_token_ids=[2], attention_backend="triton",
                    batch_invariant=True)


def test_triton_sampler_picks_what_the_twin_picks():
    """Seeded rows draw the same noise in both, so the kernel must pick the twin's tokens."""
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(3)) * 3
    settings = [dict(temperature=0.0), dict(temperature=0.8, top_k=20), dict(temperature=1.0, top_p=0.9),
                dict(temperature=1.3, min_p=0.05), dict(temperature=0.7, top_k=50, top_p=0.8, min_p=0.02),
                dict(temperature=1.0)]
    seqs = []
    for i, kw in enumerate(settings):
        req = EngineRequest(f"r{i}", "w", [5, 6, 7], SamplingParams(max_tokens=8, seed=100 + i, **kw))
        seqs.append(ScheduledSeq(req, 0, 3))
    for position in range(4):  # a few positions: fresh noise each
        for s in seqs:
            s.req.output_ids = [9] * position
        want = Sampler([2], device=DEVICE).sample(logits.to(DEVICE), seqs)
        got = Sampler([2], device=DEVICE, use_triton=True).sample(logits.to(DEVICE), seqs)
        assert list(got) == list(want)
