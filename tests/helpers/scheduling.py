"""The scheduler in unit tests: requests and schedulers made by hand, a fake paged model, steps and their checks."""
from __future__ import annotations

import random

import pytest

from rill.engine_proc.sched.batch import Batch, TokenDelta
from rill.engine_proc.sched.block_manager import NULL_BLOCK_ID, BlockManager
from rill.engine_proc.sched.request import EngineRequest, RequestState
from rill.engine_proc.sched.scheduler import Scheduler
from rill.ipc.protocol import FinishReason, SamplingParams

EOS = 2



def make_req(req_id: str, prompt_len: int = 4, max_tokens: int = 16, **params) -> EngineRequest:
    prompt_ids = [10 + (i * 7 + len(req_id)) % 50 for i in range(prompt_len)]
    return EngineRequest(req_id, "w0", prompt_ids, SamplingParams(max_tokens=max_tokens, **params))



def make_scheduler(
    num_blocks: int = 65,
    block_size: int = 4,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 64,
    max_model_len: int = 1024,
    enable_prefix_caching: bool = True,
    hash_fn=hash,
    **kwargs,
) -> Scheduler:
    return Scheduler(
        BlockManager(num_blocks, block_size, enable_prefix_caching=enable_prefix_caching, hash_fn=hash_fn),
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        eos_token_ids=[EOS],
        **kwargs,
    )



def fake_next(ids: list[int]) -> int:
    """The 'model': a deterministic function of the whole token history (never EOS)."""
    return (sum(ids) * 31 + len(ids)) % 97 + 3



class PagedFakeModel:
    """Writes each scheduled token into its KV slot and samples from what the slots hold.

    A slot holds its position's whole history (as real K/V depends on every earlier token):
    the history read from the slot before it, plus its own token. Reading back through the
    block table is what catches bookkeeping bugs: a block shared by two requests, a block
    table that does not cover a position, a recompute that skipped positions, or a prefix
    cache hit on a block computed after another prefix would feed the 'model' a wrong history.
    Given the block manager, it also asserts that no step writes into a shared block.
    """

    def __init__(self, block_size: int, block_manager: BlockManager | None = None) -> None:
        self.block_size = block_size
        self.block_manager = block_manager
        self.slots: dict[tuple[int, int], tuple[int, ...]] = {}

    def run(self, batch: Batch) -> list[int]:
        bs = self.block_size
        for seq in batch.seqs:
            block_ids = seq.req.block_ids
            end_pos = seq.start_pos + seq.num_new_tokens
            assert len(block_ids) * bs >= end_pos, "block table does not cover the step"
            assert NULL_BLOCK_ID not in block_ids
            pos = seq.start_pos
            history = self.slots[(block_ids[(pos - 1) // bs], (pos - 1) % bs)] if pos else ()
            assert len(history) == pos, "the slot before the step holds another position"
            for pos, token_id in enumerate(seq.token_ids, seq.start_pos):
                block_id = block_ids[pos // bs]
                if self.block_manager is not None:
                    assert self.block_manager.ref_counts[block_id] == 1, f"a write into shared block {block_id}"
                history += (token_id,)
                self.slots[(block_id, pos % bs)] = history
        sampled = []
        for seq in batch.sampled_seqs:
            block_ids = seq.req.block_ids
            end_pos = seq.start_pos + seq.num_new_tokens
            history = self.slots[(block_ids[(end_pos - 1) // bs], (end_pos - 1) % bs)]
            assert list(history) == seq.req.token_ids(0, end_pos), "the cache holds another history"
            sampled.append(fake_next(list(history)))
        return sampled



def step(sched: Scheduler, sampled: list[int] | None = None, model: PagedFakeModel | None = None):
    """One step as the busy loop runs it; ids hand-fed, from the fake model, or 100 + position."""
    batch = sched.schedule()
    deltas = []
    if batch:
        if sampled is None:
            if model is not None:
                sampled = model.run(batch)
            else:
                sampled = [100 + s.start_pos + s.num_new_tokens for s in batch.sampled_seqs]
        deltas = sched.update(batch, sampled)
    return batch, deltas + sched.take_errored()



def shape(batch: Batch) -> list[tuple[str, int, int]]:
    return [(s.req.req_id, s.start_pos, s.num_new_tokens) for s in batch.seqs]



def run_until_done(sched: Scheduler, model: PagedFakeModel, max_steps: int = 100_000):
    """Runs to the end; returns the ids each request streamed and its finish."""
    streamed: dict[str, list[int]] = {}
    finishes: dict[str, FinishReason] = {}
    for _ in range(max_steps):
        if not sched.has_work:
            break
        _, deltas = step(sched, model=model)
        collect(deltas, streamed, finishes)
    else:
        pytest.fail("scheduler did not drain")
    return streamed, finishes



def collect(deltas: list[TokenDelta], streamed: dict, finishes: dict) -> None:
    for delta in deltas:
        req_id = delta.req.req_id
        assert req_id not in finishes, "delta after the finish"
        streamed.setdefault(req_id, []).extend(delta.new_ids)
        if delta.finish is not None:
            finishes[req_id] = delta.finish



def reference_output(prompt_ids: list[int], max_tokens: int) -> list[int]:
    ids = list(prompt_ids)
    for _ in range(max_tokens):
        ids.append(fake_next(ids))
    return ids[len(prompt_ids) :]



def assert_all_blocks_free(sched: Scheduler) -> None:
    bm = sched.block_manager
    assert bm.num_free_blocks() == bm.num_total_blocks()
    assert all(count == 0 for count in bm.ref_counts[1:])



def run_random_workload(seed: int = 1234, make_prompt=None, **sched_kwargs) -> list[EngineRequest]:
    """40 requests arriving, aborted, preempted at random; every invariant checked each step.

    make_prompt(rng, prompt_len) -> prompt ids; by default make_req's.
    """
    rng = random.Random(seed)
    block_size = 4
    sched = make_scheduler(num_blocks=17, block_size=block_size, max_num_seqs=5, max_num_batched_tokens=12,
                           **sched_kwargs)
    bm = sched.block_manager
    model = PagedFakeModel(block_size, bm)
    # Request ids of the same length get the same prompt ids (make_req): prompts share prefixes.
    pending = [
        make_req(f"r{i}", prompt_len=rng.randint(1, 30), max_tokens=rng.randint(1, 20), ignore_eos=True)
        for i in range(40)
    ]
    if make_prompt is not None:
        for req in pending:
            req.prompt_ids = make_prompt(rng, req.num_prompt_tokens)
    reqs = list(pending)
    aborted: set[str] = set()
    streamed: dict[str, list[int]] = {}
    finishes: dict[str, FinishReason] = {}
    for _ in range(5000):
        if not pending and not sched.has_work:
            break
        for _ in range(rng.randint(0, 2)):
            if pending:
                sched.add(pending.pop(0))
        if rng.random() < 0.03 and reqs:
            victim = rng.choice(reqs)
            if sched.abort(victim.req_id) is not None:
                aborted.add(victim.req_id)
        batch = sched.schedule()
        assert batch.num_tokens <= 12
        assert sched.num_running <= 5
        holders: dict[int, int] = {}
        for req in reqs:
            assert req.state is RequestState.RUNNING or not req.block_ids, "only running requests hold blocks"
            for block_id in req.block_ids:
                holders[block_id] = holders.get(block_id, 0) + 1
        assert all(bm.ref_counts[b] == n for b, n in holders.items()), "ref counts != holders"
        assert len(holders) + bm.num_free_blocks() == bm.num_total_blocks()
        if not bm.enable_prefix_caching:
            assert max(holders.values(), default=1) == 1, "a block shared with prefix caching off"
        collect(sched.update(batch, model.run(batch)), streamed, finishes)
    else:
        pytest.fail("did not drain")
    assert_all_blocks_free(sched)
    assert sum(req.num_preemptions for req in reqs) > 0, "the workload must exercise preemption"
    for req in reqs:
        if req.req_id in aborted:
            assert req.finish is FinishReason.ABORT
            continue
        assert req.finish is FinishReason.LENGTH
        assert req.output_ids == reference_output(req.prompt_ids, req.params.max_tokens)
        assert streamed[req.req_id] == req.output_ids
    return reqs
