"""vLLM's `bad_words` (asgi/requests/bad_words.py): a word of one token is never sampled; the last token of a
longer one is not sampled right after the rest of it ends the output. Indexed once per request (BadWords, kept on
its SamplePrep) by the last token of each word's rest, so that a step compares only the words the output's last
token could be leading into: one dict lookup a row, however many words it has."""
from __future__ import annotations

import torch


class BadWords:
    __slots__ = ("singles", "by_last")

    def __init__(self, bad_words_ids: list[list[int]]) -> None:
        self.singles = [ids[0] for ids in bad_words_ids if len(ids) == 1]
        self.by_last: dict[int, list[tuple[list[int], int]]] = {}
        for ids in bad_words_ids:
            if len(ids) > 1:
                self.by_last.setdefault(ids[-2], []).append((ids[:-1], ids[-1]))

    def banned_now(self, output_ids: list[int]) -> list[int]:
        """The token ids this step may not sample, given the output so far."""
        banned = list(self.singles)
        if output_ids:
            for rest, last in self.by_last.get(output_ids[-1], ()):
                if output_ids[-len(rest):] == rest:
                    banned.append(last)
        return banned


def ban_bad_words(logits: torch.Tensor, rows: list[int], seqs, preps) -> None:
    """In place: each of `rows` gets -inf on the tokens its request's bad words ban this step."""
    vocab_size = logits.shape[1]
    for i in rows:
        # (an id past the model's vocabulary, from a tokenizer with more, can never be sampled)
        if banned := [t for t in preps[i].bad_words.banned_now(seqs[i].req.output_ids) if 0 <= t < vocab_size]:
            logits[i, banned] = float("-inf")
