"""vLLM's `bad_words` (asgi/requests/bad_words.py): a word of one token is never sampled; the last token of a
longer one is not sampled right after the rest of it ends the output."""
from __future__ import annotations

import torch


def banned_now(bad_words_ids: list[list[int]], output_ids: list[int]) -> list[int]:
    """The token ids this step may not sample, given the output so far."""
    banned = []
    for ids in bad_words_ids:
        prefix = len(ids) - 1
        if prefix == 0 or (len(output_ids) >= prefix and output_ids[-prefix:] == ids[:-1]):
            banned.append(ids[-1])
    return banned


def ban_bad_words(logits: torch.Tensor, rows: list[int], seqs) -> None:
    """In place: each of `rows` gets -inf on the tokens its request's bad words ban this step."""
    vocab_size = logits.shape[1]
    for i in rows:
        req = seqs[i].req
        # (an id past the model's vocabulary, from a tokenizer with more, can never be sampled)
        if banned := [t for t in banned_now(req.params.bad_words_ids, req.output_ids) if 0 <= t < vocab_size]:
            logits[i, banned] = float("-inf")
