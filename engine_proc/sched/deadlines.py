"""--request-timeout: the live requests in arrival order, so the overdue ones are found at the front."""
from __future__ import annotations

from collections import OrderedDict


class Deadlines:
    """Deadline of each live request, `timeout_s` after it reached the engine (0: no timeout).

    Requests come in arrival order and share one timeout, so deadlines only grow from front to
    back: `expired()` looks at the front alone, O(1) a step. A request leaves by `discard()` when
    it ends any other way, so only live requests are held.
    """

    def __init__(self, timeout_s: float = 0.0):
        assert timeout_s >= 0
        self.timeout_s = timeout_s
        self._deadlines: OrderedDict[str, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._deadlines)

    def add(self, req_id: str, arrival_s: float) -> None:
        if self.timeout_s:
            self._deadlines[req_id] = arrival_s + self.timeout_s

    def discard(self, req_id: str) -> None:
        if self._deadlines:
            self._deadlines.pop(req_id, None)

    def expired(self, now_s: float) -> list[str]:
        """The req_ids whose deadline has passed, removed from here."""
        deadlines = self._deadlines
        out = []
        while deadlines and next(iter(deadlines.values())) <= now_s:
            out.append(deadlines.popitem(last=False)[0])
        return out
