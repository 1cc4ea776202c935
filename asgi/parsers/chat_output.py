"""What the chat route makes of one choice's generated text: content, reasoning and tool calls.

The chat formatter feeds each choice's text deltas through one OutputParser and sends what it
returns as the choice's `delta`; the non-streamed `message` is the same deltas merged, so a
streamed answer always reassembles into the non-streamed one.
"""
from __future__ import annotations

from typing import Protocol


class OutputParser(Protocol):
    def push(self, text: str) -> dict:
        """Delta fields for the next piece of text: any of `content`, `reasoning_content`, and
        `tool_calls` (a list of OpenAI stream tool-call dicts: `index`, and on a call's first
        piece `id`, `type` and `function.name`; then `function.arguments` pieces). {} holds
        everything back for now."""
        ...

    def finish(self) -> dict:
        """Delta fields for whatever is still held back once the choice has ended."""
        ...

    @property
    def called_tools(self) -> bool:
        """Whether the output held tool calls (a `stop` finish is then reported as `tool_calls`)."""
        ...


class BufferedParser:
    """An OutputParser that gathers text in `pending` and turns what it can of it into delta
    fields in `_drain` (everything, when `final`)."""

    pending: str

    def push(self, text: str) -> dict:
        self.pending += text
        return self._drain(final=False)

    def finish(self) -> dict:
        return self._drain(final=True)

    def _drain(self, final: bool) -> dict:
        raise NotImplementedError


class PlainText:
    """No parsing: all text is content."""

    called_tools = False

    def push(self, text: str) -> dict:
        return {"content": text} if text else {}

    def finish(self) -> dict:
        return {}
