"""What one HTTP request did, filled in as it goes: read by the access log, the metrics and the traces.

`App.http` opens a RequestContext per request and sets it as `current()`; handlers and the
Generation fill in what they learn (model, token counts, first-token time, finish reason)
without threading it through every signature; when the response is done `App.http` hands the
finished context to the observers (access log, metrics, traces).
"""
from __future__ import annotations

import re
import time
import uuid
from contextvars import ContextVar
from dataclasses import dataclass, field

REQUEST_ID_HEADER = b"x-request-id"
MAX_REQUEST_ID_LEN = 128
# A client's id is echoed in a header and logged: visible ASCII only (UUIDs, W3C traceparent,
# AWS X-Amzn-Trace-Id all fit), no space, quote or backslash that could confuse a log reader.
_SANE_REQUEST_ID = re.compile(r'[!#-\[\]-~]{1,%d}' % MAX_REQUEST_ID_LEN)


@dataclass
class RequestContext:
    request_id: str
    method: str
    path: str
    start_s: float = field(default_factory=time.perf_counter)
    status: int = 0  # the status sent (0: nothing was sent, the client left first)
    model: str | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    # Under --prefix-cache-isolation key: the digest of the API key it came with, which salts its engine requests'
    # prefix-cache blocks (asgi/requests/cache_salt.py); "": the shared cache. Never logged.
    cache_namespace: str = field(default="", repr=False)
    first_token_s: float | None = None  # perf_counter time of the first output token
    last_token_s: float | None = None
    finish_reason: str | None = None  # stop, length, abort, error, or None (no generation)
    disconnected: bool = False
    end_s: float | None = None
    # Inter-token latency: one gap per output token after its choice's first, so a request of
    # n tokens gives n - 1 (vLLM's ITL is per token). Ids that arrive together (steps merged in
    # the mailbox while this worker was busy) share their gap since the previous arrival evenly.
    itl_s: list[float] = field(default_factory=list)
    # The engine's queue, prefill and decode times (ipc.protocol.RequestTimings), one per
    # choice that finished in the engine (none for a choice aborted before its end).
    engine_timings: list = field(default_factory=list)
    # For the trace (asgi/http/tracing.py): the request's headers (traceparent), the engine requests' sampling
    # settings and `n`, and a failed request's error code (the `code` of its error body or error event).
    headers: list = field(default=(), repr=False)
    params: object = None
    n: int = 1
    error_code: str | None = None
    # Per choice index: [first token time, last token time, number of tokens].
    _spans: dict[int, list] = field(default_factory=dict, repr=False)

    @classmethod
    def from_scope(cls, scope) -> RequestContext:
        """The client's X-Request-Id when it sends a sane one, else a new id."""
        request_id = None
        for name, value in scope.get("headers", ()):
            if name == REQUEST_ID_HEADER:
                text = value.decode("latin-1").strip()
                if _SANE_REQUEST_ID.fullmatch(text):
                    request_id = text
                break
        return cls(request_id or uuid.uuid4().hex, scope["method"], scope["path"], headers=scope.get("headers", ()))

    def token(self, num_ids: int = 1, index: int = 0) -> None:
        """`num_ids` output tokens of choice `index` reached the client now."""
        now = time.perf_counter()
        if self.first_token_s is None:
            self.first_token_s = now
        self.last_token_s = now
        span = self._spans.get(index)
        if span is None:
            self._spans[index] = [now, now, num_ids]
            self.itl_s.extend([0.0] * (num_ids - 1))
        else:
            self.itl_s.extend([(now - span[1]) / num_ids] * num_ids)
            span[1] = now
            span[2] += num_ids

    @property
    def tpot_s(self) -> list[float]:
        """Time per output token after the first, one per choice of two tokens or more."""
        return [(last - first) / (n - 1) for first, last, n in self._spans.values() if n > 1]

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.start_s

    @property
    def duration_s(self) -> float:
        return (self.end_s or time.perf_counter()) - self.start_s


_current: ContextVar[RequestContext | None] = ContextVar("rill_request", default=None)


def current() -> RequestContext | None:
    return _current.get()


def set_current(ctx: RequestContext) -> None:
    _current.set(ctx)
