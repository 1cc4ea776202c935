"""The Response object and its typed stream events, built from a choice's parsed text deltas.

The output parser (the chat path's, asgi/parsers/chat_output.py) splits the text into content,
reasoning and tool calls; each becomes an output item (`message`, `reasoning`,
`function_call`), opened and closed with OpenAI's events, in the order the model wrote them.
The non-streamed Response is the same items: a stream always reassembles into it.
"""
from __future__ import annotations

import copy
import time
from typing import Any

import msgspec

from rill.asgi.engine_link.generate import ChoiceDelta, Usage
from rill.asgi.output.logprobs_format import ChatLogprobs
from rill.asgi.parsers.chat_output import OutputParser
from rill.asgi.requests.reasoning_blob import seal
from rill.asgi.requests.responses_input import new_item_id

TERMINAL = {"completed": "response.completed", "incomplete": "response.incomplete", "failed": "response.failed",
            "cancelled": "response.failed"}


def usage_dict(usage: Usage | None, reasoning_tokens: int = 0) -> dict | None:
    if usage is None:
        return None
    return {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens}}


def sse_event(event: dict) -> bytes:
    """`event: <type>` then `data: {json}`, as OpenAI streams the Responses API."""
    return b"event: " + event["type"].encode() + b"\ndata: " + msgspec.json.encode(event) + b"\n\n"


class ResponseBuilder:
    def __init__(self, fields: dict[str, Any], parser: OutputParser, logprobs: ChatLogprobs | None,
                 sealed_reasoning: bool = False):
        self.fields = fields  # the Response's echoed request fields: id, model, instructions, tools, ...
        # include reasoning.encrypted_content: each reasoning item, once done, carries its text sealed
        # (asgi/requests/reasoning_blob.py), for the client to send back
        self.sealed_reasoning = sealed_reasoning
        self.created_at = int(time.time())
        self.parser = parser
        self.logprobs = logprobs
        self.sequence_number = 0
        self.output: list[dict] = []
        self._open: dict | None = None  # the item being written (the last of `output`)
        self._pending_logprobs: list[dict] = []
        self.status = "in_progress"
        self.incomplete_reason: str | None = None
        self.error: dict | None = None
        self.usage: Usage | None = None

    # ---- the Response object --------------------------------------------------------------

    def response(self) -> dict:
        text = "".join(p["text"] for item in self.output if item["type"] == "message"
                       for p in item["content"] if p["type"] == "output_text")
        reasoning_chars = sum(len(c["text"]) for item in self.output if item["type"] == "reasoning"
                              for c in item.get("content", []))
        done = self.status in ("completed", "incomplete")
        return {"id": self.fields["id"], "object": "response", "created_at": self.created_at, "status": self.status,
                "completed_at": int(time.time()) if done else None, "error": self.error,
                "incomplete_details": {"reason": self.incomplete_reason} if self.incomplete_reason else None,
                **{k: v for k, v in self.fields.items() if k != "id"},
                "output": self.output, "output_text": text,
                "usage": usage_dict(self.usage, self._reasoning_tokens(reasoning_chars))}

    def _reasoning_tokens(self, reasoning_chars: int) -> int:
        """The engine counts tokens, not which were thinking: estimated by the text's share."""
        if not reasoning_chars or self.usage is None:
            return 0
        total = reasoning_chars + sum(len(p["text"]) for item in self.output if item["type"] == "message"
                                      for p in item["content"])
        return round(self.usage.completion_tokens * reasoning_chars / max(total, 1))

    # ---- events ---------------------------------------------------------------------------

    def _event(self, type_: str, **fields) -> dict:
        event = {"type": type_, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return event

    def start(self) -> list[dict]:
        return [self._event("response.created", response=self.response()),
                self._event("response.in_progress", response=self.response())]

    def push(self, delta: ChoiceDelta) -> list[dict]:
        fields = self.parser.push(delta.text) if delta.text else {}
        if self.logprobs is not None:
            self._pending_logprobs += self.logprobs.content(delta.logprobs)
        events = self._on(fields)
        if delta.finish_reason is not None:
            events += self._on(self.parser.finish())
        return events

    def finish(self, finish_reason: str | None, usage: Usage) -> list[dict]:
        """Closes the open item and ends the stream with its one terminal event."""
        self.usage = usage
        incomplete = finish_reason == "length"
        events = [] if self.output else self._open_message()  # a response always has its message
        events += self._close("incomplete" if incomplete else "completed")
        self.status = "incomplete" if incomplete else "completed"
        self.incomplete_reason = "max_output_tokens" if incomplete else None
        return events + [self._event(TERMINAL[self.status], response=self.response())]

    def fail(self, message: str, code: str = "server_error", status: str = "failed") -> list[dict]:
        events = self._close("incomplete")
        self.status = status
        self.error = {"code": code, "message": message} if status == "failed" else None
        return events + [self._event(TERMINAL[status], response=self.response())]

    def _on(self, fields: dict) -> list[dict]:
        events: list[dict] = []
        if reasoning := fields.get("reasoning_content"):
            events += self._reasoning_text(reasoning)
        if content := fields.get("content"):
            events += self._output_text(content)
        for call in fields.get("tool_calls") or []:
            events += self._tool_call(call)
        return events

    def _index(self) -> int:
        return len(self.output) - 1

    def _add_item(self, item: dict) -> list[dict]:
        events = self._close("completed")
        self.output.append(item)
        self._open = item
        return events + [self._event("response.output_item.added", output_index=self._index(), item=copy.deepcopy(item))]

    def _open_message(self) -> list[dict]:
        events = self._add_item({"id": new_item_id("message"), "type": "message", "role": "assistant",
                                 "status": "in_progress", "content": []})
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        self._open["content"].append(part)
        return events + [self._event("response.content_part.added", item_id=self._open["id"],
                                     output_index=self._index(), content_index=0, part=copy.deepcopy(part))]

    def _output_text(self, text: str) -> list[dict]:
        events = [] if self._open is not None and self._open["type"] == "message" else self._open_message()
        part = self._open["content"][0]
        part["text"] += text
        logprobs, self._pending_logprobs = self._pending_logprobs, []
        part["logprobs"] += logprobs
        return events + [self._event("response.output_text.delta", item_id=self._open["id"],
                                     output_index=self._index(), content_index=0, delta=text, logprobs=logprobs)]

    def _reasoning_text(self, text: str) -> list[dict]:
        events = []
        if self._open is None or self._open["type"] != "reasoning":
            events = self._add_item({"id": new_item_id("reasoning"), "type": "reasoning", "summary": [],
                                     "content": [{"type": "reasoning_text", "text": ""}], "status": "in_progress"})
        self._open["content"][0]["text"] += text
        return events + [self._event("response.reasoning_text.delta", item_id=self._open["id"],
                                     output_index=self._index(), content_index=0, delta=text)]

    def _tool_call(self, call: dict) -> list[dict]:
        events = []
        function = call.get("function") or {}
        if call.get("id") is not None or self._open is None or self._open["type"] != "function_call":
            events = self._add_item({"id": new_item_id("function_call"), "type": "function_call",
                                     "call_id": call.get("id") or new_item_id("call"),
                                     "name": function.get("name") or "", "arguments": "", "status": "in_progress"})
        if pieces := function.get("arguments"):
            self._open["arguments"] += pieces
            events.append(self._event("response.function_call_arguments.delta", item_id=self._open["id"],
                                      output_index=self._index(), delta=pieces))
        return events

    def _close(self, status: str) -> list[dict]:
        item, self._open = self._open, None
        if item is None:
            return []
        where = {"item_id": item["id"], "output_index": self.output.index(item)}
        events = []
        if item["type"] == "message":
            part = item["content"][0]
            part["logprobs"] += self._pending_logprobs
            self._pending_logprobs = []
            events += [self._event("response.output_text.done", **where, content_index=0, text=part["text"],
                                   logprobs=part["logprobs"]),
                       self._event("response.content_part.done", **where, content_index=0, part=copy.deepcopy(part))]
        elif item["type"] == "reasoning":
            events.append(self._event("response.reasoning_text.done", **where, content_index=0,
                                      text=item["content"][0]["text"]))
            if self.sealed_reasoning:
                item["encrypted_content"] = seal(item["content"][0]["text"])
        else:
            events.append(self._event("response.function_call_arguments.done", **where, name=item["name"],
                                      arguments=item["arguments"]))
        item["status"] = status
        return events + [self._event("response.output_item.done", output_index=where["output_index"],
                                     item=copy.deepcopy(item))]


class ResponseStream:
    """The Responses API's shape for asgi/output/respond.py: the builder's typed events as SSE
    frames (no [DONE]), or the Response as one body; a response cancelled through
    POST /v1/responses/{id}/cancel ends `cancelled`, not silently as a client that left."""

    ends_with_done = False
    opens_with_first_token = False  # response.created and in_progress go out at once, as OpenAI sends them

    def __init__(self, builder: ResponseBuilder) -> None:
        self.builder = builder
        self.finish_reason: str | None = None

    def opening(self, gen) -> list[bytes]:
        return [sse_event(event) for event in self.builder.start()]

    def _push(self, deltas: list[ChoiceDelta]) -> list[dict]:
        events = []
        for delta in deltas:
            self.finish_reason = delta.finish_reason or self.finish_reason
            events += self.builder.push(delta)
        return events

    def frames(self, deltas: list[ChoiceDelta], gen) -> list[bytes]:
        return [sse_event(event) for event in self._push(deltas)]

    def failure(self, exc, gen) -> list[bytes]:
        self.builder.usage = gen.usage()
        return [sse_event(event) for event in self.builder.fail(str(exc), exc.code)]

    def _end(self, gen) -> list[dict] | None:
        if self.builder.status == "cancelled":
            self.builder.usage = gen.usage()
            return self.builder.fail("The response was cancelled.", status="cancelled")
        if gen.disconnected:
            return None
        return self.builder.finish(self.finish_reason, gen.usage())

    def closing(self, gen) -> list[bytes] | None:
        events = self._end(gen)
        return None if events is None else [sse_event(event) for event in events]

    def add(self, deltas: list[ChoiceDelta]) -> None:
        self._push(deltas)  # the events are dropped unencoded: the body is the builder's Response

    def body(self, gen) -> bytes | None:
        return None if self._end(gen) is None else msgspec.json.encode(self.builder.response())
