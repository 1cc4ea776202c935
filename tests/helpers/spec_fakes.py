"""Speculative decoding over the paged fake model: a verifier of drafts, and a loop that runs a scheduler dry."""
from __future__ import annotations

import pytest

from rill.engine_proc.sample.sampler import SamplerOutput
from rill.engine_proc.sched.batch import Batch
from rill.engine_proc.spec.verify import accepted
from tests.helpers.scheduling import PagedFakeModel, collect, fake_next


class FakeVerifier(PagedFakeModel):
    """The fake model over every row of a seq with drafts: its samples, then what verify keeps."""

    def run(self, batch: Batch):
        bs = self.block_size
        super().run(Batch([s for s in batch.seqs if not s.needs_sample or not s.draft_ids]))
        out = SamplerOutput([])
        out.spec_ids = []
        for seq in batch.sampled_seqs:
            if not seq.draft_ids:
                end = seq.start_pos + seq.num_new_tokens
                history = self.slots[(seq.req.block_ids[(end - 1) // bs], (end - 1) % bs)]
                kept = [fake_next(list(history))]
            else:
                history = list(seq.req.token_ids(0, seq.start_pos))
                for pos, token_id in enumerate(seq.token_ids, seq.start_pos):
                    history.append(token_id)
                    self.slots[(seq.req.block_ids[pos // bs], pos % bs)] = tuple(history)
                samples = [fake_next(history[: seq.start_pos + 1 + j]) for j in range(len(seq.draft_ids) + 1)]
                kept = accepted(seq.draft_ids, samples)
            out.append(kept[0])
            out.spec_ids.append(kept)
        return out


def run(sched, model, max_steps=10_000):
    streamed, finishes, batches = {}, {}, []
    for _ in range(max_steps):
        if not sched.has_work:
            return streamed, finishes, batches
        batch = sched.schedule()
        batches.append([(s.req.req_id, s.start_pos, s.num_new_tokens, list(s.draft_ids)) for s in batch.seqs])
        deltas = sched.update(batch, model.run(batch)) if batch else []
        collect(deltas + sched.take_errored(), streamed, finishes)
    pytest.fail("did not drain")
