"""The access log: one line per finished request on `rill.access`; the --log-requests lines.

The access line goes out after the response ended (it is a WorkerState observer), with the
request id, status, model, token counts, TTFT, duration and finish reason as fields. Prompt
and message text is logged nowhere but in `log_request_content`, which needs --log-requests.
Client text that reaches a log message (method, path) goes through `loggable` first.
"""
from __future__ import annotations

import logging

import msgspec

from rill.asgi.http.request_context import RequestContext, current
from rill.ipc.logs import REQUESTS_LOGGER

access_log = logging.getLogger("rill.access")
requests_log = logging.getLogger(REQUESTS_LOGGER)


# Past this, logged client text is cut: a line per request should stay a line, not a page.
MAX_LOGGED_LEN = 1024
# A backslash is doubled, so that a client's literal `\n` cannot pass for an escaped newline.
_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    if char in _ESCAPES:
        return _ESCAPES[char]
    if char.isprintable():
        return char
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def loggable(text: str, limit: int = MAX_LOGGED_LEN) -> str:
    """Client text made safe for a log message: control characters, line and paragraph
    separators and other unprintable ones escaped (a newline in a URL path would otherwise start
    a forged log line; an ANSI escape would rewrite the terminal), and cut at `limit` characters."""
    if text.isprintable() and "\\" not in text and len(text) <= limit:
        return text  # the usual case, one C-level scan
    escaped = "".join(_escape(c) for c in text[:limit])
    return escaped + "..." if len(text) > limit else escaped


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def log_access(ctx: RequestContext) -> None:
    """The observer: one INFO line for a finished request."""
    if not access_log.isEnabledFor(logging.INFO):
        return
    fields = {
        "request_id": ctx.request_id,
        "model": ctx.model,
        "prompt_tokens": ctx.prompt_tokens,
        "output_tokens": ctx.output_tokens,
        "cached_tokens": ctx.cached_tokens,
        "ttft_ms": _ms(ctx.ttft_s),
        "duration_ms": _ms(ctx.duration_s),
        "finish_reason": ctx.finish_reason,
        # status 0: the client left before anything was sent
        "disconnected": ctx.disconnected or not ctx.status,
    }
    access_log.info("%s %s %d", loggable(ctx.method), loggable(ctx.path), ctx.status, extra={"fields": fields})


def log_request_content(enabled: bool, request: msgspec.Struct) -> None:
    """With --log-requests, the decoded request (prompt or messages included) on a DEBUG line."""
    if not enabled or not requests_log.isEnabledFor(logging.DEBUG):
        return
    body = {k: v for k, v in msgspec.to_builtins(request).items() if v is not None}
    requests_log.debug("request content", extra={"fields": {"request": body}})


def tag_records_with_request_id() -> None:
    """Every record made while a request runs in this worker carries its id (`record.request_id`)."""
    make_record = logging.getLogRecordFactory()

    def factory(*args, **kwargs) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        ctx = current()
        record.request_id = None if ctx is None else ctx.request_id
        return record

    logging.setLogRecordFactory(factory)
