"""The Responses API's in-memory store: responses by id, bounded by entry count and age (TTL).

Pure: no I/O, the clock is injected. It lives in one API worker process, so with `--workers N`
a response is only found on the worker that made it (a documented limit). The oldest entry is
evicted first when the store is full; an entry older than the TTL is gone on its next lookup.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StoredResponse:
    response: dict[str, Any]  # the Response object as last sent
    input_items: list[dict[str, Any]]  # this request's own input items, each with an id
    messages: list[dict[str, Any]]  # the chat messages of the whole chain (input + output), for chaining
    stored_at: float = 0.0
    cancel: Callable[[], None] | None = None  # set while the response is in progress
    extra: dict[str, Any] = field(default_factory=dict)


class ResponseStore:
    """`max_entries` 0 or `ttl_s` 0 disables the store: nothing is kept. Entries are anything with
    a `stored_at` (responses, and conversations in their own store)."""

    def __init__(self, max_entries: int, ttl_s: float, clock: Callable[[], float] = time.monotonic):
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self.clock = clock
        self._entries: OrderedDict[str, Any] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0 and self.ttl_s > 0

    def __len__(self) -> int:
        self._expire()
        return len(self._entries)

    def put(self, response_id: str, entry: Any) -> None:
        if not self.enabled:
            return
        entry.stored_at = self.clock()
        self._entries.pop(response_id, None)
        self._entries[response_id] = entry
        self._expire()
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def get(self, response_id: str) -> Any:
        self._expire()
        return self._entries.get(response_id)

    def delete(self, response_id: str) -> bool:
        self._expire()
        return self._entries.pop(response_id, None) is not None

    def _expire(self) -> None:
        """Entries are kept in insertion order, so the expired ones are at the front."""
        now = self.clock()
        while self._entries:
            oldest_id, oldest = next(iter(self._entries.items()))
            if now - oldest.stored_at < self.ttl_s:
                return
            del self._entries[oldest_id]
