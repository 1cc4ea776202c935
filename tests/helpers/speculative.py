"""Speculative decoding in tests: the copy prompt, an n-gram speculator, prompts run through the real scheduler."""
from __future__ import annotations

from rill.engine_proc.sched.block_manager import BlockManager
from rill.engine_proc.sched.request import EngineRequest
from rill.engine_proc.sched.scheduler import Scheduler
from rill.engine_proc.spec.ngram import NgramProposer
from rill.engine_proc.spec.speculator import Speculator
from rill.ipc.protocol import SamplingParams
from tests.helpers.generation import BLOCK_SIZE, EOS_ID

COPY = ("Repeat this text exactly, word for word: The quick brown fox jumps over the lazy dog near the "
        "bank of the river, and the dog does not move at all.")



def serve(runner, prompts, params: SamplingParams, speculator=None, num_blocks: int | None = None, grammar=None):
    """Runs the prompts to their end through a real scheduler; (outputs, logprobs, steps).
    `num_blocks`: fewer KV blocks than the runner's, to force preemptions. `grammar()`: each request's
    RequestGrammar."""
    sched = Scheduler(BlockManager(num_blocks or runner.kv_cache.num_blocks, BLOCK_SIZE), max_num_seqs=8,
                      max_num_batched_tokens=512, max_model_len=1024, eos_token_ids=[EOS_ID], speculator=speculator)
    reqs = [EngineRequest(f"r{i}", "w", list(p), params) for i, p in enumerate(prompts)]
    for r in reqs:
        r.grammar = grammar() if grammar is not None else None
    logprobs = {r.req_id: [] for r in reqs}
    for r in reqs:
        sched.add(r)
    steps = 0
    while sched.has_work:
        batch = sched.schedule()
        sampled = runner.execute(batch)
        lp_of = {id(s.req): lp for s, lp in zip(batch.sampled_seqs, sampled.logprobs or [])}
        for d in sched.update(batch, sampled):
            if (lp := lp_of.get(id(d.req))) is not None:
                logprobs[d.req.req_id].append(lp.head(len(d.new_ids)))
        steps += 1
    serve.num_preemptions = sched.num_preemptions
    return [r.output_ids for r in reqs], [logprobs[r.req_id] for r in reqs], steps



def ngram(k=4):
    return Speculator(NgramProposer(k, 2, 4), k)
