"""A row with no token left to sample: its request's constraints together excluded every one."""
from __future__ import annotations

import logging

import torch

from rill.engine_proc.sched.batch import ScheduledSeq
from rill.ipc.protocol import FinishReason

log = logging.getLogger("rill.sample")


def end_rows_without_a_token(logits: torch.Tensor, token_ids: torch.Tensor, seqs: list[ScheduledSeq],
                             rows: list[int], eos_token_ids: list[int]) -> None:
    """Rows whose logits are all -inf (their allowed_token_ids, bad_words and grammar exclude every token) get a
    stop token instead of whatever the choice picked, and their request ends there (STOP), as when the model
    stops: never a token outside the constraints, and never a failed request for what the client combined."""
    dead = (logits[rows].amax(dim=-1) == float("-inf")).nonzero().flatten().tolist()
    for j in dead:
        req = seqs[rows[j]].req
        log.warning("request %s: its allowed_token_ids, bad_words and grammar leave no token; ending it", req.req_id)
        token_ids[rows[j]] = eos_token_ids[0] if eos_token_ids else 0
        req.no_token_left = True
        if req.grammar is not None and req.grammar.finish is None:  # ends as its grammar says: here, as a stop
            req.grammar.finish = FinishReason.STOP
