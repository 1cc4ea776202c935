"""OpenAI's `logit_bias`: per-request additions to chosen tokens' logits, before sampling."""
from __future__ import annotations

import torch

from rill.engine_proc.sample.prepared import SamplePrep


def biased_rows(preps: list[SamplePrep]) -> list[int]:
    """One attribute read per row: a step where no row asks does no tensor work."""
    return [i for i, prep in enumerate(preps) if prep.has_bias]


def add_logit_bias(logits: torch.Tensor, rows: list[int], preps: list[SamplePrep]) -> None:
    """In place: each of `rows` gets its bias added to its tokens' logits, one op per row
    whatever the bias's size (its ids and values were made tensors once, in SamplePrep)."""
    for i in rows:
        prep = preps[i]
        if prep.bias_ids is None:  # dense: a whole-vocabulary vector
            logits[i] += prep.bias_values.to(logits.dtype)
        else:
            logits[i].index_add_(0, prep.bias_ids, prep.bias_values.to(logits.dtype))
