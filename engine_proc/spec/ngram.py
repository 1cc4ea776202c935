"""Drafts from the request's own tokens: what followed the last time its latest n-gram occurred.

Prompt lookup decoding (vLLM's method "ngram"): when a model quotes, edits or repeats its input,
the tokens after an earlier occurrence of the last few tokens are likely to come next. Each
request keeps a dict from every n-gram (prompt_lookup_min <= n <= prompt_lookup_max) to where its
latest occurrence ends, grown by the tokens added since the last step: a lookup costs a few dict
reads, never a scan of the whole context.
"""
from __future__ import annotations

from rill.engine_proc.sched.request import EngineRequest


class NgramIndex:
    """One request's n-grams -> the position of their latest occurrence's last token."""

    __slots__ = ("ends", "num_indexed")

    def __init__(self) -> None:
        self.ends: dict[tuple[int, ...], int] = {}
        # N-grams ending at positions < num_indexed are in `ends`. The last token's own n-grams
        # are entered only once a later token exists, so a lookup never finds the suffix itself.
        self.num_indexed = 0


class NgramProposer:
    def __init__(self, num_speculative_tokens: int, min_n: int, max_n: int) -> None:
        assert 1 <= min_n <= max_n and num_speculative_tokens >= 1
        self.num_speculative_tokens = num_speculative_tokens
        self.min_n = min_n
        self.max_n = max_n

    def propose(self, req: EngineRequest, max_drafts: int) -> list[int]:
        """Up to min(num_speculative_tokens, max_drafts) tokens to follow req's tokens; [] if none."""
        num_drafts = min(self.num_speculative_tokens, max_drafts)
        if num_drafts <= 0:
            return []
        index = req.spec_state
        if index is None:
            index = req.spec_state = NgramIndex()
        num_tokens = req.num_tokens
        # Enough tokens before the new ones to form their n-grams, and the suffix to look up.
        base = max(0, min(index.num_indexed, num_tokens - 1) - self.max_n + 1)
        tokens = req.token_ids(base, num_tokens)
        self._index(index, tokens, base, num_tokens - 1)
        for n in range(min(self.max_n, num_tokens - 1), self.min_n - 1, -1):
            end = index.ends.get(tuple(tokens[num_tokens - n - base :]))
            if end is not None:
                return req.token_ids(end + 1, min(end + 1 + num_drafts, num_tokens))
        return []

    def _index(self, index: NgramIndex, tokens: list[int], base: int, upto: int) -> None:
        ends = index.ends
        low, high = self.min_n, self.max_n
        for end in range(index.num_indexed, upto):
            stop = end + 1 - base
            for n in range(low, min(high, end + 1) + 1):
                ends[tuple(tokens[stop - n : stop])] = end
        index.num_indexed = max(index.num_indexed, upto)
