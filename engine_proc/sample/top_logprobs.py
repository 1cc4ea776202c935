"""A sampled row's logprob, its rank and the top k tokens of the row: what a request with `logprobs` gets."""
from __future__ import annotations

import torch

from rill.ipc.logprobs import TokenLogprobs


def top_stable(raw_logprobs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs, ids) [n, k] of each row's k largest, in a stable descending sort's order: among tied logprobs
    (common with bfloat16 logits) the lowest id first, as greedy argmax picks it, so a greedy token is its own top
    entry. Not a sort of the vocabulary: topk finds the k-th value, and only the entries at or above it (k, and
    whatever ties the k-th) are sorted. One row of 49,152 took 4.4 ms through the whole sort, 0.1 ms this way."""
    kth = raw_logprobs.topk(k, dim=-1).values[:, -1:]
    m = int((raw_logprobs >= kth).sum(dim=-1).max())  # each row's candidates are within its m largest
    values, ids = raw_logprobs.topk(m, dim=-1)
    by_id = ids.sort(dim=-1).indices  # lowest id first, then a stable sort by value keeps that among ties
    values, ids = values.gather(1, by_id), ids.gather(1, by_id)
    order = values.sort(dim=-1, descending=True, stable=True).indices[:, :k]
    return values.gather(1, order), ids.gather(1, order)


def gather_logprobs(
    raw_logprobs: torch.Tensor, token_ids: torch.Tensor, nums_top: list[int]
) -> list[TokenLogprobs]:
    """Per row: the chosen token's logprob and rank, and the top `nums_top[i]` ids and logprobs.

    raw_logprobs [n, V]; token_ids [n] the chosen ids. The rank is 1-based and counts every
    token whose logprob is >= the chosen one's, so a tie ranks the chosen token last (as vLLM).
    """
    max_top = min(max(nums_top), raw_logprobs.shape[1])
    if max_top:
        top_logprobs, top_ids = top_stable(raw_logprobs, max_top)
    else:  # the chosen tokens' logprobs alone
        top_logprobs = raw_logprobs.new_empty((raw_logprobs.shape[0], 0))
        top_ids = torch.empty((raw_logprobs.shape[0], 0), dtype=torch.long, device=raw_logprobs.device)
    chosen = token_ids.unsqueeze(1)
    chosen_logprobs = raw_logprobs.gather(1, chosen)
    ranks = (raw_logprobs >= chosen_logprobs).sum(dim=-1).to(torch.int32).cpu().numpy()
    ids = torch.cat([chosen, top_ids], dim=1).to(torch.int32).cpu().numpy()
    logprobs = torch.cat([chosen_logprobs, top_logprobs], dim=1).cpu().numpy()
    return [
        TokenLogprobs(ids[i : i + 1, : 1 + k], logprobs[i : i + 1, : 1 + k], ranks[i : i + 1])
        for i, k in enumerate(min(k, max_top) for k in nums_top)
    ]
