"""ChatFormatter with an OutputParser: streamed deltas, their merge into the message, finish reasons."""
from __future__ import annotations

import json

from rill.asgi.engine_link.generate import ChoiceDelta, Usage
from rill.asgi.output.chat_delta import merge_delta, message
from rill.asgi.output.chat_format import ChatFormatter
from tests.helpers.openapi import validate


class FakeToolParser:
    """Text before "<call>" is content; after it, one tool call whose arguments are the rest."""

    def __init__(self):
        self.in_call = False
        self.called_tools = False

    def push(self, text: str) -> dict:
        if self.in_call:
            return {"tool_calls": [{"index": 0, "function": {"arguments": text}}]}
        if "<call>" not in text:
            return {"content": text}
        before, after = text.split("<call>", 1)
        self.in_call = self.called_tools = True
        out = {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                               "function": {"name": "f", "arguments": after}}]}
        return {"content": before, **out} if before else out

    def finish(self) -> dict:
        return {"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]} if self.in_call else {}


class HoldAll:
    called_tools = False

    def push(self, text: str) -> dict:
        self.held = getattr(self, "held", "") + text
        return {}

    def finish(self) -> dict:
        return {"reasoning_content": "thought", "content": self.held}


DELTAS = [[ChoiceDelta(0, "Let me ", None), ChoiceDelta(1, "Plain", None)],
          [ChoiceDelta(0, "see<call>{\"a\": ", None)],
          [ChoiceDelta(0, "1", "stop"), ChoiceDelta(1, " text", "length")]]


def formatter(make_parser) -> ChatFormatter:
    return ChatFormatter("chatcmpl-1", "m", 2, False, make_parser=make_parser)


def parsers_by_choice():
    made = iter([FakeToolParser(), FakeToolParser()])
    return lambda: next(made)


def test_stream_sends_parser_deltas_and_reports_tool_calls():
    fmt = formatter(parsers_by_choice())
    chunks = [json.loads(c) for c in fmt.opening_chunks()]
    for item in DELTAS:
        chunks += [json.loads(c) for c in fmt.chunks(item)]
    for chunk in chunks:
        validate("CreateChatCompletionStreamResponse", chunk)
        assert len(chunk["choices"]) == 1
    of_0 = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == 0]
    assert of_0[0]["delta"] == {"role": "assistant", "content": ""}
    assert of_0[2]["delta"] == {"content": "see", "tool_calls": [
        {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": "}}]}
    # The finishing delta merges the last push with finish(): one tool-call piece per index.
    assert of_0[3]["delta"] == {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}
    assert of_0[3]["finish_reason"] == "tool_calls"
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["index"] == 1][-1] == "length"


def test_body_merges_the_same_deltas():
    fmt = formatter(parsers_by_choice())
    for item in DELTAS:
        fmt.add(item)
    body = json.loads(fmt.body(Usage(10, 5)))
    validate("CreateChatCompletionResponse", body)
    first, second = body["choices"]
    assert first["message"] == {"role": "assistant", "content": "Let me see", "refusal": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]}
    assert first["finish_reason"] == "tool_calls"
    assert second["message"] == {"role": "assistant", "content": "Plain text", "refusal": None}
    assert second["finish_reason"] == "length" and body["usage"]["total_tokens"] == 15


def test_held_back_text_sends_no_chunk_until_finish():
    fmt = ChatFormatter("chatcmpl-1", "m", 1, True, make_parser=HoldAll)
    assert fmt.chunks([ChoiceDelta(0, "abc", None)]) == []
    [last] = fmt.chunks([ChoiceDelta(0, "d", "stop")])
    chunk = json.loads(last)
    assert chunk["choices"][0]["delta"] == {"reasoning_content": "thought", "content": "abcd"}
    assert chunk["usage"] is None  # include_usage: null until the usage chunk
    fmt = ChatFormatter("chatcmpl-1", "m", 1, False, make_parser=HoldAll)
    fmt.add([ChoiceDelta(0, "abc", None)])
    fmt.add([ChoiceDelta(0, "d", "stop")])
    assert json.loads(fmt.body(Usage()))["choices"][0]["message"] == {
        "role": "assistant", "content": "abcd", "refusal": None, "reasoning_content": "thought"}


def test_merge_keeps_the_first_id_and_name_and_joins_arguments():
    merged = {}
    for piece in [{"tool_calls": [{"index": 1, "id": "b", "type": "function", "function": {"name": "g", "arguments": ""}}]},
                  {"tool_calls": [{"index": 0, "id": "a", "type": "function", "function": {"name": "f"}}]},
                  {"tool_calls": [{"index": 1, "function": {"arguments": "[1"}}, {"index": 0, "function": {"arguments": "{}"}}]},
                  {"tool_calls": [{"index": 1, "function": {"arguments": "]"}}]}]:
        merge_delta(merged, piece)
    assert message(merged) == {"role": "assistant", "content": None, "refusal": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        {"id": "b", "type": "function", "function": {"name": "g", "arguments": "[1]"}}]}
