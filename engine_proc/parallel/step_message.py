"""One step's batch as rank 0 sends it to the other tensor-parallel ranks, and its replica there.

A rank runs the model's forward on the same batch as rank 0 (same tokens, positions and block
tables: every rank's KV cache has the same blocks, each holding its own heads), so it needs what
engine_proc/model/step_inputs.py and decode_graphs.py read of a batch and nothing of the requests
themselves: per sequence its new tokens, where they start, its blocks, and which rows to score.
"""
from __future__ import annotations

from dataclasses import dataclass

import msgspec

from rill.engine_proc.sched.batch import Batch


class SeqStep(msgspec.Struct, array_like=True, gc=False):
    token_ids: list[int]
    start_pos: int
    block_ids: list[int]  # the blocks this step's tokens and context lie in
    needs_sample: bool
    scored: tuple[int, int] = (0, 0)  # prompt positions scored this step: range(*scored)
    num_logits_rows: int = 1  # a sampled seq's rows of logits: 1 + its drafts (engine_proc/spec/)


class StepMessage(msgspec.Struct, array_like=True, gc=False):
    seqs: list[SeqStep] = []
    graphs: bool = False  # through the compiled decode graphs, as rank 0 runs it
    stop: bool = False  # rank 0 is stopping: the ranks exit


encoder = msgspec.msgpack.Encoder()
decoder = msgspec.msgpack.Decoder(StepMessage)


def encode_step(batch: Batch, graphs: bool, block_size: int) -> bytes:
    seqs = []
    for s in batch.seqs:
        end = s.start_pos + s.num_new_tokens
        scored = s.prompt_scored
        seqs.append(SeqStep(s.token_ids, s.start_pos, s.req.block_ids[: -(-end // block_size)], s.needs_sample,
                            (scored.start, scored.stop) if scored else (0, 0), s.num_logits_rows))
    return encoder.encode(StepMessage(seqs, graphs))


STOP = encoder.encode(StepMessage(stop=True))


@dataclass(eq=False)
class _Params:
    prompt_logprobs: int | None
    embed: bool = False


@dataclass(eq=False)
class _ReplicaReq:
    """What the step's inputs read of a request: its blocks, its tokens of this step."""

    block_ids: list[int]
    step_tokens: list[int]
    start_pos: int
    params: _Params

    def token_ids(self, start: int, end: int) -> list[int]:
        return self.step_tokens[start - self.start_pos: end - self.start_pos]


@dataclass(eq=False)
class ReplicaSeq:
    req: _ReplicaReq
    start_pos: int
    num_new_tokens: int
    token_ids: list[int]
    needs_sample: bool
    prompt_scored: range
    num_logits_rows: int = 1


@dataclass(eq=False)
class ReplicaBatch:
    """A Batch's shape for the step inputs: seqs, sampled_seqs, scoring_seqs."""

    seqs: list[ReplicaSeq]

    @property
    def sampled_seqs(self) -> list[ReplicaSeq]:
        return [s for s in self.seqs if s.needs_sample]

    @property
    def scoring_seqs(self) -> list[ReplicaSeq]:
        return [s for s in self.seqs if s.prompt_scored]

    def __bool__(self) -> bool:
        return bool(self.seqs)


def replica_batch(message: StepMessage) -> ReplicaBatch:
    seqs = []
    for s in message.seqs:
        scored = range(*s.scored)
        req = _ReplicaReq(s.block_ids, s.token_ids, s.start_pos, _Params(1 if scored else None))
        seqs.append(ReplicaSeq(req, s.start_pos, len(s.token_ids), s.token_ids, s.needs_sample, scored,
                               s.num_logits_rows))
    return ReplicaBatch(seqs)
