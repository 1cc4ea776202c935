"""One request's place in its grammar: fills its row of the token bitmask, accepts each sampled token."""
from __future__ import annotations

import logging
import time

from rill.ipc.protocol import FinishReason

log = logging.getLogger("rill.engine")

# A grammar whose forced text takes longer than this to find (a schema's constant of many kilobytes: xgrammar
# covers all of it with tokens, about 1 us a token here), or its drafts' masks to fill (0.3 ms for 8 JSON key
# tokens here), drafts from it no more: no one request may slow every step.
JUMP_BUDGET_S = 0.002


class RequestGrammar:
    """Wraps an xgrammar GrammarMatcher for one request (EngineRequest.grammar).

    `finish` is what the scheduler reads, and all it needs (it never imports xgrammar): STOP
    once the matcher accepted a stop token, which the bitmask allows only where the grammar is
    complete; ERROR if it refused a token (only a token the mask let through is ever sampled,
    so that is a bug, and the request ends rather than emit text outside its grammar).

    Preemption by recompute keeps `output_ids` and samples nothing until the request has
    recomputed them, so the matcher, which has accepted exactly those ids, stays valid.

    With `start_ids` (StructuredSpec.start_ids: harmony's final channel), the output is free, and the
    matcher sees nothing, until the output has written them; the grammar holds from the next token.

    Drafts (engine_proc/spec/speculator.py): `forced_ids` are the tokens the grammar forces next (xgrammar's
    jump-forward), `valid_prefix` cuts another proposer's drafts where the grammar refuses one, and
    `draft_masks` are the bitmask rows that verify them. Each leaves the matcher where it was.
    """

    __slots__ = ("_matcher", "finish", "_start", "_tail", "_jumps", "drafted")

    def __init__(self, compiled_grammar, start_ids: list[int] | None = None) -> None:
        import xgrammar as xgr

        self._matcher = xgr.GrammarMatcher(compiled_grammar)
        self.finish: FinishReason | None = None
        self._start = start_ids or []
        self._tail: list[int] = []  # before the start: the output's last len(start) ids
        self._jumps = True  # False once finding the forced text took longer than JUMP_BUDGET_S
        self.drafted = False  # the step's drafts were the grammar's own (SpecStats counts them apart)

    def fill_bitmask(self, bitmask, row: int) -> None:
        """Sets `bitmask[row]` to the tokens the grammar allows next (a stop token once it may end).

        A matcher that fails here ends its own request (ERROR), not the whole step's batch.
        """
        if self.finish is not None or self._start:  # ends in this step's update(), or not begun: all allowed
            return
        try:
            self._matcher.fill_next_token_bitmask(bitmask, row)
        except RuntimeError:
            log.exception("the grammar matcher failed; ending the request")
            self.finish = FinishReason.ERROR
            return
        if not bitmask[row].any():  # a dead end (a schema no value meets, that xgrammar did not refuse to compile)
            log.warning("the grammar allows no next token; ending the request there (stop)")
            self.finish = FinishReason.STOP  # the client's schema, not a failure: its choice ends as the model's would

    def accept(self, token_id: int) -> None:
        if self.finish is not None:
            return
        if self._start:
            self._tail = [*self._tail[1 - len(self._start):], token_id] if len(self._start) > 1 else [token_id]
            if self._tail == self._start:
                self._start = []  # begun: the next token is the grammar's
            return
        matcher = self._matcher
        if not matcher.accept_token(token_id):
            log.error("the grammar refused token %d, which its bitmask allowed; ending the request", token_id)
            self.finish = FinishReason.ERROR
        elif matcher.is_terminated():
            self.finish = FinishReason.STOP

    def forced_ids(self, most: int) -> list[int]:
        """Up to `most` tokens that spell what the grammar forces next (a JSON key, the punctuation around it),
        xgrammar's greedy cover of that text; the model verifies them as drafts. None past a stop token."""
        if most <= 0 or self.finish is not None or self._start or not self._jumps:
            return []
        started = time.perf_counter()
        ids = self._matcher.find_jump_forward_tokens()
        if time.perf_counter() - started > JUMP_BUDGET_S:
            self._jumps = False
            log.info("a grammar's forced text took %.1f ms to find: its request drafts from it no more",
                     (time.perf_counter() - started) * 1e3)
        return ids[:most]

    def valid_prefix(self, drafts: list[int]) -> list[int]:
        """The drafts up to the first the grammar refuses or a stop token (never drafted with a grammar)."""
        if self.finish is not None or self._start:
            return []
        matcher, num = self._matcher, 0
        stop_ids = set(matcher.stop_token_ids)
        for token in drafts:
            if token in stop_ids or not matcher.accept_token(token):
                break
            num += 1
        if num:
            matcher.rollback(num)
        return drafts[:num]

    def draft_masks(self, drafts: list[int], vocab_size: int):
        """(bitmask [len(drafts), words]: row j what the grammar allows after drafts[:j + 1], the number of drafts
        that may be kept): those before the first whose successor has a mask of nothing (a dead end), whose row
        must not give a token. The row for the token before the drafts is fill_bitmask's, in the step."""
        import xgrammar as xgr

        started = time.perf_counter()
        bitmask = xgr.allocate_token_bitmask(len(drafts), vocab_size)
        matcher, num, usable = self._matcher, 0, len(drafts)
        for j, token in enumerate(drafts):
            if not matcher.accept_token(token):  # valid_prefix checked them: not expected
                usable = j
                break
            num += 1
            matcher.fill_next_token_bitmask(bitmask, j)
            if matcher.is_terminated() or not bitmask[j].any():
                usable = j
                break
        if num:
            matcher.rollback(num)
        if time.perf_counter() - started > JUMP_BUDGET_S:  # masks slow to fill: its forced tokens are drafted no more
            self._jumps = False
        return bitmask, usable


class DraftRowMask:
    """A draft row's grammar in the sampler (engine_proc/spec/verify.py): its bitmask row, filled ahead. The
    request's own grammar takes the tokens kept once they are known."""

    __slots__ = ("mask", "finish")

    def __init__(self, mask) -> None:
        self.mask = mask
        self.finish = None if mask.any() else FinishReason.STOP

    def fill_bitmask(self, bitmask, row: int) -> None:
        bitmask[row] = self.mask

    def accept(self, token_id: int) -> None:
        pass
