"""Admission control: bound the engine's waiting queue, decided on the input thread at once.

The input thread admits or refuses each Submit against counts of what waits in the engine, so a
refusal never waits behind a model step (a long prefill can take a second). The busy loop keeps
those counts current: once an iteration, right after `schedule()`, it reports the scheduler's
waiting queue and how many of the admitted requests it has taken in since. Until then they
count as pending here, so an admitted request is never outside both counts, and the bounds hold
whatever the number of API workers: every Submit comes through this one object.
"""
from __future__ import annotations

import math
import threading
import time

from rill.ipc.protocol import Verdict

MAX_RETRY_AFTER_S = 60  # the OpenAI SDK ignores a longer Retry-After and uses its own backoff
_SMOOTHING = 0.25  # weight of the newest interval between queue departures


class AdmissionControl:
    """`admit()` on the input thread; `update()` on the busy loop; 0 is no limit.

    A Submit is refused when its requests would make more than `max_queued_requests` wait (seats
    free in the running batch absorb as many, while nothing else waits), or when the waiting
    requests' tokens would pass `max_queued_tokens`. Its real size counts even when nothing
    waits: a Submit that passes a bound on its own (more requests, prompts x n, than
    `max_num_seqs + max_queued_requests`, or more tokens than `max_queued_tokens`) could never
    be admitted within it, and is refused with TOO_MANY_REQUESTS or TOO_MANY_TOKENS (a 400: no
    retry helps) rather than let in to hold the whole engine.
    """

    def __init__(self, max_queued_requests: int = 0, max_queued_tokens: int = 0, *, max_num_seqs: int = 0,
                 clock=time.monotonic):
        assert max_queued_requests >= 0 and max_queued_tokens >= 0
        self.max_queued_requests = max_queued_requests
        self.max_queued_tokens = max_queued_tokens
        self.max_num_seqs = max_num_seqs
        self.clock = clock
        self._lock = threading.Lock()
        # The busy loop's figures as of its last update().
        self._num_waiting = 0
        self._num_waiting_tokens = 0
        self._num_free_seats = max_num_seqs
        # Admitted here, not yet taken in by the busy loop.
        self._num_pending = 0
        self._num_pending_tokens = 0
        self.num_rejected = 0  # engine requests refused, since start
        # Retry-After: how often a request leaves the queue while requests wait (an average of
        # recent intervals), timed from when the queue last started waiting or last moved.
        self._backlog_since_s: float | None = None
        self._departure_interval_s: float | None = None

    @property
    def enabled(self) -> bool:
        """With no bound the engine admits everything and sends no Admission replies."""
        return bool(self.max_queued_requests or self.max_queued_tokens)

    @property
    def num_queued(self) -> int:
        """Requests waiting as the loop last saw them, plus those admitted since."""
        return self._num_waiting + self._num_pending

    def too_large(self, num_requests: int, num_tokens: int) -> Verdict | None:
        """TOO_MANY_* for a Submit that passes a bound on its own; None if it fits."""
        if self.max_queued_requests and num_requests > self.limit_of(Verdict.TOO_MANY_REQUESTS):
            return Verdict.TOO_MANY_REQUESTS
        if self.max_queued_tokens and num_tokens > self.max_queued_tokens:
            return Verdict.TOO_MANY_TOKENS
        return None

    def limit_of(self, verdict: Verdict) -> int:
        """The bound a TOO_MANY_* Submit passes on its own (0 for other verdicts)."""
        if verdict is Verdict.TOO_MANY_REQUESTS:
            return self.max_queued_requests + self.max_num_seqs  # every seat taken, the queue full
        return self.max_queued_tokens if verdict is Verdict.TOO_MANY_TOKENS else 0

    def admit(self, num_requests: int, num_tokens: int) -> Verdict:
        """Admits (and counts) or refuses one Submit of `num_requests` requests, `num_tokens` tokens."""
        with self._lock:
            num_queued = self._num_waiting + self._num_pending
            num_queued_tokens = self._num_waiting_tokens + self._num_pending_tokens
            verdict = Verdict.ADMITTED
            if (too_large := self.too_large(num_requests, num_tokens)) is not None:
                verdict = too_large
            elif self.max_queued_requests and num_queued + num_requests > (
                    self.max_queued_requests + (0 if self._num_waiting else self._num_free_seats)):
                verdict = Verdict.QUEUE_FULL
            elif self.max_queued_tokens and num_queued_tokens + num_tokens > self.max_queued_tokens:
                verdict = Verdict.QUEUE_TOKENS_FULL
            if verdict is Verdict.ADMITTED:
                self._num_pending += num_requests
                self._num_pending_tokens += num_tokens
            else:
                self.num_rejected += num_requests
            return verdict

    def update(self, num_taken: int, num_taken_tokens: int, num_waiting: int, num_waiting_tokens: int,
               num_free_seats: int) -> None:
        """The loop took in `num_taken` admitted requests since its last update, and after this
        step's `schedule()` has `num_waiting` requests waiting and `num_free_seats` seats free."""
        with self._lock:
            num_left = self._num_waiting + num_taken - num_waiting  # preemptions make it smaller
            self._num_pending -= num_taken
            self._num_pending_tokens -= num_taken_tokens
            self._num_waiting = num_waiting
            self._num_waiting_tokens = num_waiting_tokens
            self._num_free_seats = num_free_seats
        self._time_departures(num_left, num_waiting)

    def _time_departures(self, num_left: int, num_waiting: int) -> None:
        now = self.clock()
        since = self._backlog_since_s
        if num_left > 0 and since is not None:
            interval = (now - since) / num_left
            average = self._departure_interval_s
            self._departure_interval_s = interval if average is None else average + _SMOOTHING * (interval - average)
        if not num_waiting:
            self._backlog_since_s = None
        elif num_left > 0 or since is None:
            self._backlog_since_s = now

    def retry_after_s(self) -> int:
        """Whole seconds until a waiting request is likely to leave the queue (1 before any has)."""
        interval = self._departure_interval_s
        if interval is None:
            return 1
        return min(MAX_RETRY_AFTER_S, max(1, math.ceil(interval)))
