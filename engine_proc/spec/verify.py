"""Verification of drafted tokens in the step that computes them: the target model's own samples.

A sequence with drafts d[0..k-1] gets k + 1 rows of logits: row j is the target's distribution
for the token after d[:j]. Each row is sampled as if the tokens before it were already the
request's output (its seed's noise, min_tokens and penalties see len(output) + j tokens), and
the drafts are kept while they equal the rows' samples; the first row that differs gives its own
sample instead, and when every draft matches, row k gives one more.

Every token kept is thus a sample of the target's distribution given the tokens before it, so the
output is distributed exactly as without speculation. Drafts here are single tokens, not
distributions (n-gram lookup, or a draft model's argmax): this is rejection sampling with a point
mass as the proposal, which accepts d[j] with probability p(d[j]) and otherwise samples
p(x | x != d[j]), as the coupled sample does. A greedy or seeded request's output is the one it
gets without speculation, token for token.

A request with a grammar has each draft row masked by what its grammar allows after the drafts before it
(RequestGrammar.draft_masks, filled before the sampler runs); its own row is masked, and its sample taken, by the
grammar in the sampler as in any step, and the grammar takes the other tokens kept here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rill.engine_proc.grammar.matcher import DraftRowMask
from rill.engine_proc.sample.sampler import Sampler, SamplerOutput
from rill.engine_proc.sched.batch import ScheduledSeq
from rill.ipc.logprobs import TokenLogprobs
from rill.ipc.protocol import SamplingParams


@dataclass(eq=False, slots=True)
class _RowRequest:
    """What the sampler reads of a request, as it stands before one of its draft rows."""

    params: SamplingParams
    prompt_ids: list[int]
    output_ids: list[int]
    grammar: Any = None
    sample_prep: Any = None  # its request's (engine_proc/sample/prepared.py): built once, not per row


@dataclass(eq=False, slots=True)
class _Row:
    req: _RowRequest


def sample(sampler: Sampler, logits: torch.Tensor, seqs: list[ScheduledSeq]) -> SamplerOutput:
    """One sampled token per seq, or for a step with drafts the tokens each seq keeps
    (`SamplerOutput.spec_ids`); logits has seq.num_logits_rows rows per seq, in order."""
    if not any(s.draft_ids for s in seqs):
        return sampler.sample(logits, seqs)
    rows: list[ScheduledSeq | _Row] = []
    usable = []  # per seq, the drafts that may be kept (a grammar's dead end cuts them)
    for s in seqs:
        rows.append(s)
        req = s.req
        masks, num = (None, len(s.draft_ids)) if req.grammar is None or not s.draft_ids else \
            req.grammar.draft_masks(s.draft_ids, logits.shape[1])
        usable.append(num)
        for j in range(1, len(s.draft_ids) + 1):
            rows.append(_Row(_RowRequest(req.params, req.prompt_ids, req.output_ids + s.draft_ids[:j],
                                          grammar=None if masks is None else DraftRowMask(masks[j - 1]),
                                          sample_prep=req.sample_prep)))
    row_out = sampler.sample(logits, rows)
    out = SamplerOutput([])
    out.spec_ids = []
    logprobs: list[TokenLogprobs | None] | None = [] if row_out.logprobs is not None else None
    first = 0
    for s, num in zip(seqs, usable):
        samples = row_out[first : first + 1 + len(s.draft_ids)]
        kept = accepted(s.draft_ids[:num], samples)
        if s.req.grammar is not None:  # the first was taken in the sampler
            for token in kept[1:]:
                s.req.grammar.accept(token)
        out.append(kept[0])
        out.spec_ids.append(kept)
        if logprobs is not None:
            parts = row_out.logprobs[first : first + len(kept)]
            logprobs.append(None if parts[0] is None else TokenLogprobs.concat(parts))
        first += len(samples)
    out.logprobs = logprobs
    return out


def accepted(drafts: list[int], samples: list[int]) -> list[int]:
    """The tokens kept: the drafts while they equal the samples, then the first sample that differs
    (or the one after the last draft)."""
    num = 0
    while num < len(drafts) and drafts[num] == samples[num]:
        num += 1
    return list(samples[: num + 1])
