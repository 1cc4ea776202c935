"""Greedy generation through the real scheduler and engine step, every sampled row checked against
transformers' logits over the request's whole sequence (tests/e2e/test_hf_runner.py,
tests/model/test_transformers_route.py)."""
from __future__ import annotations

import queue

import torch

from rill.engine_proc.core import EngineCore
from rill.engine_proc.sched.batch import Batch
from rill.engine_proc.sched.block_manager import BlockManager
from rill.engine_proc.sched.request import EngineRequest
from rill.engine_proc.sched.scheduler import Scheduler
from rill.engine_proc.sched.window_tables import window_tables_of
from rill.ipc.protocol import FinishReason, SamplingParams

EOS_ID = 2
BLOCK_SIZE = 8
NUM_NEW_TOKENS = 12
SHARED = [5 + (i * 7) % 120 for i in range(26)]  # a prefix of more than three blocks
PROMPTS = {
    "a": SHARED + [9, 41, 77],
    "b": [13, 101, 56, 3, 88, 20, 64, 31, 47],
    "c": [7, 19, 123, 60, 33, 90, 12, 71, 26, 58, 44, 99, 15, 82, 37, 6, 111, 50],
    "a2": SHARED + [30, 2, 115, 8],  # a prefix-cache hit on "a"'s blocks when it comes later
}


def hf_continuations(hf_model, num_tokens: int = NUM_NEW_TOKENS) -> dict[str, list[int]]:
    """transformers' greedy continuation of each of PROMPTS."""
    expected = {}
    with torch.inference_mode():
        for name, ids in PROMPTS.items():
            out = hf_model.generate(torch.tensor([ids]), max_new_tokens=num_tokens, min_new_tokens=num_tokens,
                                    do_sample=False, pad_token_id=0)
            expected[name] = out[0, len(ids):].tolist()
    return expected


def run_scheduled(runner, hf_model, arrivals: dict[str, int], *, num_blocks: int = 64,
                  max_num_batched_tokens: int = 2048, caching: bool = False, atol: float = 1e-4,
                  num_new_tokens: int = NUM_NEW_TOKENS, on_step=None, reference=None,
                  speculator=None) -> dict[str, EngineRequest]:
    """Greedy generation of PROMPTS through the real scheduler and engine step, each prompt arriving
    at its step. `on_step(running requests)` after each step.

    Every sampled row is also checked against transformers' logits over the request's whole
    sequence: tiny random models are nearly bigram models, so their greedy tokens alone would
    hardly notice a cache that holds the wrong context. `reference(req_id, index of the output
    token)`: the logits to check the row against instead. With a `speculator`, each draft's row is checked too.
    """
    mismatches: list[str] = []
    compute_logits = type(runner).compute_logits

    def checked_compute_logits(batch: Batch, *args, **kwargs) -> torch.Tensor:
        logits = compute_logits(runner, batch, *args, **kwargs)
        rows = iter(logits)
        with torch.inference_mode():
            for seq in batch.sampled_seqs:
                before = seq.req.token_ids(0, seq.start_pos + seq.num_new_tokens - len(seq.draft_ids))
                for j in range(seq.num_logits_rows):  # the last token's row, then one after each draft
                    row, ids = next(rows), before + seq.draft_ids[:j]
                    expected = (hf_model(torch.tensor([ids])).logits[0, -1] if reference is None
                                else reference(seq.req.req_id, len(ids) - seq.req.num_prompt_tokens))
                    if not torch.allclose(row.float().cpu(), expected, atol=atol, rtol=atol):
                        mismatches.append(f"{seq.req.req_id} at {len(ids)} tokens: {(row - expected).abs().max():.3g}")
        return logits

    # A model whose every layer slides: its out-of-window blocks released as in the engine (main.py).
    # Sliding and global layers: the sliding layers' window tables, as in the engine.
    scheduler = Scheduler(
        BlockManager(num_blocks, BLOCK_SIZE, enable_prefix_caching=caching,
                     sliding_window=runner.sliding_window, window=window_tables_of(runner)),
        max_num_seqs=8, max_num_batched_tokens=max_num_batched_tokens, max_model_len=256, eos_token_ids=[EOS_ID],
        speculator=speculator,
    )
    core = EngineCore(scheduler, runner, queue.SimpleQueue(), lambda out: None)
    params = SamplingParams(max_tokens=num_new_tokens, temperature=0.0, min_tokens=num_new_tokens)
    reqs = {name: EngineRequest(name, "w", list(PROMPTS[name]), params) for name in arrivals}
    runner.compute_logits = checked_compute_logits  # execute() calls it; a failure here would end the batch
    try:
        for step_index in range(1000):
            for name, arrival in arrivals.items():
                if arrival == step_index:
                    scheduler.add(reqs[name])
            if step_index > max(arrivals.values()) and not scheduler.has_work:
                break
            batch = scheduler.schedule()
            if batch:
                core.step(batch)
                if on_step is not None:
                    on_step([r for r in reqs.values() if r.block_ids])
    finally:
        del runner.compute_logits
    assert mismatches == []
    assert [r.finish for r in reqs.values()] == [FinishReason.LENGTH] * len(reqs)
    return reqs


def outputs(reqs: dict[str, EngineRequest]) -> dict[str, list[int]]:
    return {name: r.output_ids for name, r in reqs.items()}
