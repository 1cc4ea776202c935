"""Prompt logprobs: how likely the model found each prompt token, given the tokens before it.

The logits at position p score prompt token p + 1. A request that asks (SamplingParams.
prompt_logprobs) has the rows of its `prompt_scored` positions after the sampled rows of the
step's logits (engine_proc/model/step_inputs.py logits_rows); everyone else adds no row.
"""
from __future__ import annotations

import torch

from rill.engine_proc.sample.top_logprobs import top_stable
from rill.engine_proc.sched.batch import ScheduledSeq
from rill.ipc.logprobs import TokenLogprobs

ROWS_PER_SLICE = 256  # log_softmax over the vocabulary a slice at a time: memory stays bounded


def score_prompts(logits: torch.Tensor, seqs: list[ScheduledSeq]) -> list[TokenLogprobs]:
    """Per seq of `seqs` (batch.scoring_seqs): the logprobs of the prompt tokens its rows score.

    logits [sum of len(s.prompt_scored), V], in the order of `seqs`.
    """
    out = []
    row = 0
    for seq in seqs:
        positions = seq.prompt_scored
        prompt = seq.req.prompt_ids
        targets = torch.tensor(prompt[positions.start + 1 : positions.stop + 1], dtype=torch.long,
                               device=logits.device)
        num_top = seq.req.params.prompt_logprobs
        rows = logits[row : row + len(positions)]
        parts = [score_rows(rows[i : i + ROWS_PER_SLICE], targets[i : i + ROWS_PER_SLICE], num_top)
                 for i in range(0, len(positions), ROWS_PER_SLICE)]
        out.append(TokenLogprobs.concat(parts))
        row += len(positions)
    return out


def score_rows(logits: torch.Tensor, targets: torch.Tensor, num_top: int) -> TokenLogprobs:
    """Each row's target token's logprob and rank, and the row's top `num_top` ids and logprobs.

    The model's own distribution (log_softmax of the raw logits, in float32), as the sampled
    tokens' logprobs are. The rank is 1-based and counts every token whose logprob is >= the
    target's, as vLLM ranks.
    """
    raw = logits.float().log_softmax(dim=-1)
    chosen = targets.unsqueeze(1)
    chosen_logprobs = raw.gather(1, chosen)
    ranks = (raw >= chosen_logprobs).sum(dim=-1).to(torch.int32)
    ids, logprobs = chosen, chosen_logprobs
    if num_top:
        top_logprobs, top_ids = top_stable(raw, min(num_top, raw.shape[1]))  # ties ordered as the sampled rows
        ids, logprobs = torch.cat([chosen, top_ids], dim=1), torch.cat([chosen_logprobs, top_logprobs], dim=1)
    return TokenLogprobs(ids.to(torch.int32).cpu().numpy(), logprobs.cpu().numpy(), ranks.cpu().numpy())
