"""--batch-invariant: a request's logits are bit for bit the same alone, in any batch, at any chunking.

Run in float32 and bfloat16 on whatever CPU runs the suite: the kernels oneDNN picks differ by
CPU (AVX2, AVX-512, AMX) and by dtype, which is what the mode has to hold against. The model is the
bundled one's first 4 layers and its head (`short_model_dir`): every operator and shape of the whole model,
and a difference in any layer's last bit reaches the logits; all 30 layers took 4.5 times as long.
"""
from __future__ import annotations

import os
import random

import pytest
import torch

from rill.engine_proc.attention import cpu as cpu_attention
from rill.engine_proc.cpu_features import cpu_info
from rill.engine_proc.model.hf_paged import PagedTransformersRunner
from rill.engine_proc.model.runner import ModelRunner
from rill.engine_proc.sched.batch import Batch, ScheduledSeq
from rill.engine_proc.sched.request import EngineRequest
from rill.ipc.protocol import SamplingParams
from tests.helpers.generation import BLOCK_SIZE, BlockAllocator
from tests.helpers.runners import make_runner

NUM_STEPS = 5


def onednn_avx512() -> bool:
    """Whether oneDNN runs its AVX-512 kernels here (tests/model/test_cpu_kernels_portable.py caps it at AVX2)."""
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()
    return cpu_info().has("avx512f") and (isa == "ALL" or "AVX512" in isa or "AMX" in isa)


# The CPU backend runs every token through the C++ kernel as a row of its own; the torch backend
# (no C++ compiler) pads contexts instead (engine_proc/attention/invariant.py). Both must hold, on
# the native model and on transformers' own (the paged transformers route, engine_proc/model/hf_paged.py).
@pytest.fixture(scope="module", params=[("cpu", torch.float32, "native"), ("cpu", torch.bfloat16, "native"),
                                        ("torch", torch.float32, "native"), ("torch", torch.bfloat16, "native"),
                                        ("cpu", torch.float32, "transformers"), ("torch", torch.bfloat16, "transformers")],
                ids=lambda p: f"{p[0]}-{str(p[1])[6:]}-{p[2]}")
def runners(request, short_model_dir) -> dict[bool, ModelRunner]:
    backend, dtype, impl = request.param
    if backend == "cpu" and not cpu_attention.available():
        pytest.skip("no C++ compiler: the CPU kernel is not built")
    runner_class = PagedTransformersRunner if impl == "transformers" else None

    def make(invariant: bool) -> ModelRunner:
        return make_runner(short_model_dir, dtype=dtype, num_kv_blocks=160, block_size=BLOCK_SIZE, eos_token_ids=[2],
                           batch_invariant=invariant, attention_backend=backend, runner_class=runner_class)
    runners = {True: make(True), False: make(False)}
    assert runners[True].attention.name == ("batch-invariant-cpu" if backend == "cpu" else "batch-invariant")
    return runners


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(100, 40000) for _ in range(n)] for n in (40, 17, 70, 33, 90, 5, 128, 64)]


def first_request_logits(runner: ModelRunner, prompts: list[list[int]], *, chunk_len: int | None = None,
                         num_steps: int = NUM_STEPS) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy steps of every prompt together; the first prompt's tokens and its logits at each step."""
    allocator = BlockAllocator(runner.kv_cache.num_blocks)
    params = SamplingParams(max_tokens=64, temperature=0.0)
    reqs = [EngineRequest(f"r{i}", "w", list(p), params) for i, p in enumerate(prompts)]
    logits_of_first = []
    while len(reqs[0].output_ids) < num_steps:
        seqs = []
        for req in reqs:
            num_new = req.num_tokens - req.num_computed_tokens
            if chunk_len is not None:
                num_new = min(num_new, chunk_len)
            allocator.cover(req, req.num_computed_tokens + num_new)
            seqs.append(ScheduledSeq(req, req.num_computed_tokens, num_new))
        batch = Batch(seqs)
        logits = runner.compute_logits(batch)
        for s in seqs:
            s.req.num_computed_tokens = s.start_pos + s.num_new_tokens
        for row, s in enumerate(batch.sampled_seqs):
            if s.req is reqs[0]:
                logits_of_first.append(logits[row].clone())
            s.req.output_ids.append(int(logits[row].argmax()))
    return reqs[0].output_ids, logits_of_first


@pytest.fixture(scope="module")
def alone(runners, prompts):
    return first_request_logits(runners[True], prompts[:1])


@pytest.mark.parametrize("num_others, chunk_len", [(1, None), (3, None), (7, None), (0, 7), (7, 24)])
def test_logits_do_not_depend_on_the_batch(runners, prompts, alone, num_others, chunk_len):
    tokens, logits = first_request_logits(runners[True], prompts[: 1 + num_others], chunk_len=chunk_len)
    assert tokens == alone[0]
    for step, (got, want) in enumerate(zip(logits, alone[1])):
        assert torch.equal(got, want), f"step {step}: max diff {float((got - want).abs().max())}"


def test_a_recompute_repeats_the_decode_bit_for_bit(runners, prompts, alone):
    """After a preemption the generated tokens are recomputed as prompt rows, here among others."""
    tokens, decode_logits = alone
    resumed = prompts[0] + tokens[:-1]
    _, logits = first_request_logits(runners[True], [resumed, *prompts[1:4]], chunk_len=13, num_steps=1)
    assert torch.equal(logits[0], decode_logits[-1])


def test_the_default_mode_moves_in_the_last_bits_but_agrees(runners, prompts, alone):
    """What the mode is for: by default the same request's logits change with the batch (so the
    test above can fail), though only in the last bits, and the greedy tokens agree."""
    dtype = runners[False].dtype
    tokens_alone, logits_alone = first_request_logits(runners[False], prompts[:1])
    tokens, logits = first_request_logits(runners[False], prompts[:4])
    if dtype == torch.float32 and onednn_avx512():
        assert any(not torch.equal(a, b) for a, b in zip(logits, logits_alone))
    # They may not move elsewhere: the CPU decode kernel computes each row alone, and where oneDNN's
    # matmul kernels do too (bf16 with AMX; float32 with its AVX2 kernels, seen on a Zen 4 with
    # ONEDNN_MAX_CPU_ISA=AVX2), the default mode can already be invariant at these batch sizes.
    # On the AVX-512 CPUs seen here (Sapphire Rapids, Zen 4) float32 moves: the test above can fail.
    # bfloat16 keeps 8 bits of mantissa: one unit in the last place of a logit of 20 is 0.125,
    # and the layers' roundings add up to a few of those.
    atol = 1e-3 if dtype == torch.float32 else 1.0
    steps = len(logits) if dtype == torch.float32 else 1  # later bf16 steps may follow another token
    if dtype == torch.float32:
        assert tokens == tokens_alone == alone[0]
    for a, b, inv in list(zip(logits, logits_alone, alone[1]))[:steps]:
        torch.testing.assert_close(a, b, rtol=0, atol=atol)
        torch.testing.assert_close(inv, b, rtol=0, atol=atol)
