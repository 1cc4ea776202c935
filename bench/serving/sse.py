"""An incremental Server-Sent Events parser: feed it bytes as they arrive, get whole events back.

Follows the WHATWG event-stream rules (LF, CRLF or CR line ends, `:` comments, multi-line
`data:` joined with LF, one optional space after the colon, a leading BOM dropped) with one
deliberate divergence: `close()` dispatches an event that the stream ended without its blank
line, because a benchmark would rather see a server's last `data: [DONE]` than drop it.
Pure: no I/O, no clock, no JSON, so a benchmark can run it after the timed part of a request.
"""
from __future__ import annotations

from dataclasses import dataclass

DONE = "[DONE]"  # OpenAI's end-of-stream sentinel, sent as the data of the last event
_BOM = "\ufeff"


@dataclass(slots=True)
class SSEEvent:
    data: str
    event: str = "message"  # the `event:` field; servers may name an error event "error"
    id: str | None = None

    @property
    def is_done(self) -> bool:
        return self.data == DONE


class SSEParser:
    def __init__(self) -> None:
        self._partial_line = b""  # bytes after the last line end seen, never holding a CR
        self._skip_lf = False  # the last feed ended in CR: a LF opening the next one is its pair
        self._first_line = True
        self._data_lines: list[str] = []
        self._event_name = ""
        self._last_id: str | None = None
        self.num_comments = 0  # `: keep-alive` and friends; counted, otherwise ignored

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Parse one read's bytes; returns the events it completed (often none or one)."""
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        buf = self._partial_line + chunk if self._partial_line else chunk
        if b"\r" in buf:
            # A CR at the very end ends a line now; its LF, if any, comes in the next read.
            self._skip_lf = buf.endswith(b"\r")
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        self._partial_line = lines.pop()
        events: list[SSEEvent] = []
        for line in lines:
            self._line(line.decode("utf-8", "replace"), events)
        return events

    def close(self) -> list[SSEEvent]:
        """The stream ended: parse a last unterminated line and dispatch what is pending."""
        events: list[SSEEvent] = []
        if self._partial_line:
            self._line(self._partial_line.decode("utf-8", "replace"), events)
            self._partial_line = b""
        self._dispatch(events)
        return events

    def _line(self, line: str, events: list[SSEEvent]) -> None:
        if self._first_line:
            self._first_line = False
            if line.startswith(_BOM):
                line = line[1:]
        if not line:
            self._dispatch(events)
            return
        if line[0] == ":":
            self.num_comments += 1
            return
        name, _, value = line.partition(":")
        if value[:1] == " ":
            value = value[1:]
        if name == "data":
            self._data_lines.append(value)
        elif name == "event":
            self._event_name = value
        elif name == "id" and "\0" not in value:
            self._last_id = value
        # `retry:` and unknown fields are ignored, as the spec says.

    def _dispatch(self, events: list[SSEEvent]) -> None:
        if self._data_lines:
            events.append(SSEEvent("\n".join(self._data_lines), self._event_name or "message", self._last_id))
        self._data_lines = []
        self._event_name = ""
