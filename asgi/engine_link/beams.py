"""Beam search over one prompt, step by step, as transformers' `generate(num_beams=...)` searches.

Each step the caller runs every live beam one token further on the engine and brings each beam's top
K next tokens with their logprobs (K = `BeamSet.top_k`: twice the width, more with several end tokens,
as transformers keeps; the best K continuations of all beams are among them). The K best
continuations by summed logprob are ranked; the first `width` that do not end become the next live
beams, and those ranked within `width` that end (an end token, or the length limit) are kept as
finished hypotheses, scored by their summed logprob over (generated length ** length_penalty). The
search stops when no live beam can beat the worst of `width` finished ones (transformers' heuristic
for `early_stopping=False`: the best live beam scored at its current length), once `width` have
finished when `early_stopping` is true, or at the length limit. The best `width` finished, best
first, are the answer.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rill.ipc.logprobs import TokenLogprobs


@dataclass(eq=False)
class Beam:
    tokens: list[int] = field(default_factory=list)  # generated so far (an end token last, once finished)
    logprob: float = 0.0  # the sum of its tokens' logprobs
    # per token: the step's top ids and logprobs, the token's place among them, its 1-based rank
    rows: list[tuple[np.ndarray, np.ndarray, int, int]] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" (an end token) or "length", once finished
    score: float = 0.0  # once finished: logprob / len(tokens) ** length_penalty

    def logprobs(self) -> TokenLogprobs | None:
        """Each token's logprob, its 1-based rank and the step's top tokens, as the engine gives them."""
        if not self.rows:
            return None
        ids = np.stack([np.concatenate((top[j : j + 1], top)) for top, _, j, _ in self.rows]).astype(np.int32)
        lps = np.stack([np.concatenate((lp[j : j + 1], lp)) for _, lp, j, _ in self.rows]).astype(np.float32)
        return TokenLogprobs(ids, lps, np.array([rank for *_, rank in self.rows], dtype=np.int32))


class BeamSet:
    """The search for one prompt: `live` beams to run next, `finished` hypotheses (best first)."""

    def __init__(self, width: int, max_tokens: int, end_ids: frozenset[int], *, length_penalty: float = 1.0,
                 early_stopping: bool = False, min_tokens: int = 0):
        self.width = width
        self.max_tokens = max_tokens
        self.end_ids = end_ids  # empty with ignore_eos
        self.length_penalty = length_penalty
        self.early_stopping = early_stopping
        self.min_tokens = min_tokens
        self.live: list[Beam] = [Beam()]
        self.finished: list[Beam] = []
        self.step = 0  # tokens each live beam holds

    @staticmethod
    def top_k(width: int, num_end_ids: int) -> int:
        return max(2, 1 + num_end_ids) * width

    @property
    def done(self) -> bool:
        return not self.live

    def advance(self, tops: list[tuple[np.ndarray, np.ndarray]]) -> None:
        """One step: `tops[i]` is live beam i's top next token ids and their logprobs, best first."""
        width, k = self.width, self.top_k(self.width, len(self.end_ids))
        candidates = []  # (summed logprob, beam index, position in its top)
        for i, (beam, (ids, lps)) in enumerate(zip(self.live, tops)):
            for j, (tok, lp) in enumerate(zip(ids.tolist(), lps.tolist())):
                if self.step < self.min_tokens and tok in self.end_ids:
                    continue  # no end before min_tokens (transformers' min_new_tokens)
                candidates.append((beam.logprob + lp, i, j))
        candidates.sort(key=lambda c: -c[0])  # stable: ties keep the lower beam and the better rank first
        self.step += 1
        at_limit = self.step >= self.max_tokens
        live = []
        for rank, (total, i, j) in enumerate(candidates[:k]):
            parent, (ids, lps) = self.live[i], tops[i]
            tok = int(ids[j])
            ends = tok in self.end_ids
            if not ends and not at_limit:
                if len(live) < width:
                    live.append(self._child(parent, ids, lps, j, total))
            elif rank < width:  # only the top `width` may finish
                self._finish(self._child(parent, ids, lps, j, total), "stop" if ends else "length")
        self.live = [] if at_limit else live
        if self.live and self._cannot_improve():
            self.live = []

    def _child(self, parent: Beam, ids: np.ndarray, lps: np.ndarray, j: int, total: float) -> Beam:
        rank = int((lps >= lps[j]).sum())  # as the engine ranks: a tie counts the token last
        return Beam(parent.tokens + [int(ids[j])], total, parent.rows + [(ids, lps, j, rank)])

    def _finish(self, beam: Beam, reason: str) -> None:
        beam.finish_reason = reason
        beam.score = beam.logprob / (len(beam.tokens) ** self.length_penalty)
        self.finished.append(beam)
        self.finished.sort(key=lambda b: -b.score)
        del self.finished[self.width:]

    def _cannot_improve(self) -> bool:
        if len(self.finished) < self.width:
            return False
        if self.early_stopping:
            return True
        best_live = self.live[0].logprob / (self.step ** self.length_penalty)
        return best_live <= self.finished[-1].score

    def best(self) -> list[Beam]:
        """The answer once done: the best `width` finished, best first."""
        return self.finished[: self.width]
