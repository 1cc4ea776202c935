"""Repetition, frequency and presence penalties with vLLM's semantics, batched over the rows that use them.

repetition_penalty r acts on every token seen in the prompt or the output: a positive logit is
divided by r, a negative one multiplied (so r > 1 always makes a seen token less likely).
frequency_penalty f and presence_penalty p act on output tokens only:
logit -= f * count + p * (count > 0). Greedy rows are penalised too.

Only the seen tokens change, so the work is gathered and scattered over their ids: it grows
with the tokens seen, never with the vocabulary (vLLM instead builds [n, V] counts and masks).
"""
from __future__ import annotations

import torch

from rill.engine_proc.sched.request import EngineRequest
from rill.ipc.protocol import SamplingParams


def uses_penalties(params: SamplingParams) -> bool:
    return (
        params.repetition_penalty != 1.0 or params.frequency_penalty != 0.0 or params.presence_penalty != 0.0
    )


def apply_penalties(
    logits: torch.Tensor,
    seen_ids: torch.Tensor,
    output_ids: torch.Tensor,
    presence: torch.Tensor,
    frequency: torch.Tensor,
    repetition: torch.Tensor,
) -> torch.Tensor:
    """Penalised logits [n, V] (a new tensor): the tensor form, one row per request.

    seen_ids [n, L] long: the ids a row's penalties touch (its output ids, and its prompt ids
    when its repetition penalty is not 1), padded by repeating one of the row's own ids; a row
    with none is padded with any id, which comes back unchanged since its counts are 0 and
    its repetition penalty is 1. output_ids [n, M] long: each row's output ids, padded with an
    id >= V. presence, frequency, repetition [n] float32.
    """
    # How often each seen id occurs in its row's output: two binary searches in the sorted row.
    sorted_output = output_ids.sort(dim=1).values
    after = torch.searchsorted(sorted_output, seen_ids, right=True)
    counts = after - torch.searchsorted(sorted_output, seen_ids)
    values = logits.gather(1, seen_ids)
    r = repetition.unsqueeze(1)
    values = torch.where(values > 0, values / r, values * r)
    values = values - frequency.unsqueeze(1) * counts - presence.unsqueeze(1) * (counts > 0)
    # A repeated id (in the prompt and the output, or padding) writes the same value each time.
    return logits.scatter(1, seen_ids, values)


def penalize(logits: torch.Tensor, reqs: list[EngineRequest]) -> torch.Tensor:
    """The logits [len(reqs), V] of requests that use penalties, penalised (a new tensor).

    The prompt's ids are a tensor made once (SamplePrep.prompt_ids); the output's are converted
    each step (it grows), in C: no Python loop over a row's tokens.
    """
    seen_rows = []
    output_rows = []
    for r in reqs:
        output = torch.tensor(r.output_ids, dtype=torch.long)
        output_rows.append(output)
        if r.params.repetition_penalty == 1.0:
            seen_rows.append(output)
        else:
            assert r.prompt_ids, "a repetition penalty needs a prompt: padding relies on it"
            seen_rows.append(torch.cat([output, _prompt_ids(r)]))
    params = [r.params for r in reqs]
    device = logits.device
    return apply_penalties(
        logits,
        _padded(seen_rows, pad=None).to(device),
        _padded(output_rows, pad=logits.shape[1]).to(device),
        torch.tensor([p.presence_penalty for p in params], dtype=torch.float32, device=device),
        torch.tensor([p.frequency_penalty for p in params], dtype=torch.float32, device=device),
        torch.tensor([p.repetition_penalty for p in params], dtype=torch.float32, device=device),
    )


def _prompt_ids(req) -> torch.Tensor:
    prep = getattr(req, "sample_prep", None)
    if prep is not None and prep.prompt_ids is not None:
        return prep.prompt_ids
    return torch.tensor(req.prompt_ids, dtype=torch.long)


def _padded(rows: list[torch.Tensor], pad: int | None) -> torch.Tensor:
    """Rows as one [len(rows), longest] long tensor; pad None repeats each row's first id (0 if empty)."""
    width = max(1, max(len(r) for r in rows))
    out = torch.empty(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
        out[i, len(row) :] = (row[0] if len(row) else 0) if pad is None else pad
    return out
