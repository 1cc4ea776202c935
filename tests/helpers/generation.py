"""Driving a runner by hand in tests: shuffled KV blocks, a minimal scheduler's greedy generation, per-step logits."""
from __future__ import annotations

import random

import torch

from rill.engine_proc.model.runner import ModelRunner
from rill.engine_proc.sched.batch import Batch, ScheduledSeq
from rill.engine_proc.sched.request import EngineRequest
from rill.ipc.protocol import SamplingParams

EOS_ID = 2



BLOCK_SIZE = 16



NUM_NEW_TOKENS = 32



MESSAGES = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue, and mention Rayleigh scattering by name.",
]



class BlockAllocator:
    """Hands out block ids in a shuffled order, so block tables are neither contiguous nor sorted.
    Never block 0: as in the engine's block manager it is the null block, which the padding rows of
    a CUDA graph's decode step write."""

    def __init__(self, num_blocks: int, seed: int = 0) -> None:
        self.free_ids = list(range(1, num_blocks))
        random.Random(seed).shuffle(self.free_ids)

    def cover(self, req: EngineRequest, num_tokens: int) -> None:
        while len(req.block_ids) * BLOCK_SIZE < num_tokens:
            req.block_ids.append(self.free_ids.pop())



def hf_greedy(hf_model, prompts: list[list[int]], num_new: int = NUM_NEW_TOKENS) -> list[list[int]]:
    """transformers' greedy continuation of each prompt; min_new_tokens holds eos back as min_tokens does."""
    out = []
    with torch.inference_mode():
        for ids in prompts:
            generated = hf_model.generate(
                torch.tensor([ids]), max_new_tokens=num_new, min_new_tokens=num_new, do_sample=False
            )
            out.append(generated[0, len(ids) :].tolist())
    return out


def generate(
    runner: ModelRunner,
    prompts: list[list[int]],
    *,
    max_tokens: int = NUM_NEW_TOKENS,
    chunk_len: int | None = None,
    arrival_steps: list[int] | None = None,
) -> list[list[int]]:
    """A minimal scheduler: every live request gets its next chunk (or decode token) each step."""
    allocator = BlockAllocator(runner.kv_cache.num_blocks)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, min_tokens=max_tokens)
    reqs = [EngineRequest(f"r{i}", "w", list(p), params) for i, p in enumerate(prompts)]
    arrival_steps = arrival_steps or [0] * len(reqs)
    step = 0
    while any(len(r.output_ids) < max_tokens for r in reqs):
        seqs = []
        for req, arrival in zip(reqs, arrival_steps):
            if arrival > step or len(req.output_ids) >= max_tokens:
                continue
            num_new = req.num_tokens - req.num_computed_tokens
            if chunk_len is not None:
                num_new = min(num_new, chunk_len)
            allocator.cover(req, req.num_computed_tokens + num_new)
            seqs.append(ScheduledSeq(req, req.num_computed_tokens, num_new))
        step += 1
        if not seqs:
            continue
        batch = Batch(seqs)
        sampled = runner.execute(batch)
        assert len(sampled) == len(batch.sampled_seqs)
        for s in seqs:
            s.req.num_computed_tokens = s.start_pos + s.num_new_tokens
        for s, token_id in zip(batch.sampled_seqs, sampled):
            s.req.output_ids.append(token_id)
    return [r.output_ids for r in reqs]


def step_logits(runner: ModelRunner, prompts: list[list[int]], *, chunk_len: int, num_steps: int):
    """Every row's logits at every step, with chunked prefills of later arrivals mixed into decodes."""
    allocator = BlockAllocator(runner.kv_cache.num_blocks)
    params = SamplingParams(max_tokens=64, temperature=0.0)
    reqs = [EngineRequest(f"r{i}", "w", list(p), params) for i, p in enumerate(prompts)]
    out = []
    for step in range(num_steps):
        seqs = []
        for i, req in enumerate(reqs):
            if i > step:  # request i arrives at step i
                continue
            num_new = min(req.num_tokens - req.num_computed_tokens, chunk_len)
            allocator.cover(req, req.num_computed_tokens + num_new)
            seqs.append(ScheduledSeq(req, req.num_computed_tokens, num_new))
        batch = Batch(seqs)
        logits = runner.compute_logits(batch).cpu().clone()  # a graph's output is overwritten by the next step
        out.append(logits)
        for s in seqs:
            s.req.num_computed_tokens = s.start_pos + s.num_new_tokens
        for row, s in enumerate(batch.sampled_seqs):
            s.req.output_ids.append(int(logits[row].argmax()))
    return out, [r.output_ids for r in reqs]


def generate_logits(runner: ModelRunner, prompts: list[list[int]]) -> torch.Tensor:
    """Each prompt's first-token logits, the prompts in one prefill step."""
    reqs = [EngineRequest(f"r{i}", "w", ids, SamplingParams(max_tokens=1)) for i, ids in enumerate(prompts)]
    allocator = BlockAllocator(runner.kv_cache.num_blocks)
    for req in reqs:
        allocator.cover(req, req.num_tokens)
    return runner.compute_logits(Batch([ScheduledSeq(r, 0, r.num_tokens) for r in reqs]))
