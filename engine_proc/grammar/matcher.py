"""One request's place in its grammar: fills its row of the token bitmask, accepts each sampled token."""
from __future__ import annotations

import logging

from rill.ipc.protocol import FinishReason

log = logging.getLogger("rill.engine")


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
    """

    __slots__ = ("_matcher", "finish", "_start", "_tail")

    def __init__(self, compiled_grammar, start_ids: list[int] | None = None) -> None:
        import xgrammar as xgr

        self._matcher = xgr.GrammarMatcher(compiled_grammar)
        self.finish: FinishReason | None = None
        self._start = start_ids or []
        self._tail: list[int] = []  # before the start: the output's last len(start) ids

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
