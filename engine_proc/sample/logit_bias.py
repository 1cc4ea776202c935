"""OpenAI's `logit_bias`: per-request additions to chosen tokens' logits, before sampling."""
from __future__ import annotations

import torch

from engine_proc.sched.batch import ScheduledSeq


def uses_logit_bias(seqs: list[ScheduledSeq]) -> bool:
    """One attribute read per row: a step where no row asks does no tensor work."""
    return any(s.req.params.logit_bias for s in seqs)


def add_logit_bias(logits: torch.Tensor, seqs: list[ScheduledSeq]) -> None:
    """In place: each row's bias added to its tokens' logits (ids past the vocabulary skipped)."""
    rows: list[int] = []
    cols: list[int] = []
    values: list[float] = []
    vocab_size = logits.shape[1]
    for i, s in enumerate(seqs):
        for token_id, bias in s.req.params.logit_bias.items():
            if 0 <= token_id < vocab_size:  # checked against the tokenizer's vocabulary at the edge
                rows.append(i)
                cols.append(token_id)
                values.append(bias)
    if rows:
        device = logits.device
        logits.index_put_((torch.tensor(rows, device=device), torch.tensor(cols, device=device)),
                          torch.tensor(values, dtype=logits.dtype, device=device), accumulate=True)
