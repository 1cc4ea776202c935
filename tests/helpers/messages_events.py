"""A checker of an Anthropic Messages event stream's grammar; it returns the Message the events build.

The grammar (Anthropic's "Streaming Messages"): message_start first; then each content block at
index 0, 1, 2, ... in order, none interleaved: content_block_start(i), deltas of the block's own
kind at index i (text_delta for text, input_json_delta for tool_use, thinking_delta then
signature_delta for thinking), content_block_stop(i); then one message_delta and message_stop,
last. `ping` may come anywhere (this server sends it before message_start, while the prompt is
read); an `error` event may end the stream at any point. Every event is also checked against the
Anthropic SDK's own model of it, and the rebuilt Message against its Message.
"""
from __future__ import annotations

import json

import httpx
import pydantic
from anthropic.types import Message, RawMessageStreamEvent

from tests.helpers.http_calls import MODEL

PING = {"type": "ping"}
DELTAS = {"text": ("text_delta",), "tool_use": ("input_json_delta",), "thinking": ("thinking_delta", "signature_delta")}
STOP_REASONS = ("end_turn", "max_tokens", "stop_sequence", "tool_use")
_event_model = pydantic.TypeAdapter(RawMessageStreamEvent)


def parse_sse(text: str) -> list[tuple[str, dict]]:
    """(the `event:` name, the data's JSON) per event, from the stream's whole text. Each event is
    exactly an `event:` line and a `data:` line: this stream's keep-alive is `ping`, so an SSE
    comment (or any other line) fails."""
    events = []
    for chunk in text.split("\n\n"):
        if not chunk:
            continue
        lines = chunk.split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), \
            f"not an `event:` and `data:` pair: {chunk!r}"
        events.append((lines[0][len("event: "):], json.loads(lines[1][len("data: "):])))
    return events


def check_stream(named_events: list[tuple[str, dict]]) -> dict:
    """Asserts the grammar; returns the Message rebuilt from the events (with `error` set when an
    error event ended the stream)."""
    events = []
    for name, event in named_events:
        assert name == event.get("type"), f"event line {name!r} differs from the data's type {event.get('type')!r}"
        if name == "ping":
            assert event == PING, f"a ping's data is {PING}; got {event}"
            continue
        if name != "error":
            _event_model.validate_python(event)
        events.append(event)
    assert events, "no event but pings"
    errors = [i for i, e in enumerate(events) if e["type"] == "error"]
    assert not errors or errors == [len(events) - 1], "an error event ends the stream"
    assert events[0]["type"] == "message_start" or errors == [0], "message_start comes first"
    if errors == [0]:
        return {"error": events[0]["error"]}
    message = dict(events[0]["message"])
    assert message["content"] == [] and message["stop_reason"] is None, "message_start holds an empty Message"
    message["content"] = []
    rest = events[1:]
    if errors:
        message["error"] = rest.pop()["error"]
    position = _blocks(rest, message["content"])
    if "error" in message:
        assert position >= len(rest) - 2, "after the blocks: only message_delta and message_stop"
        return message
    tail = [e["type"] for e in rest[position:]]
    assert tail == ["message_delta", "message_stop"], f"after the blocks: one message_delta, then message_stop; got {tail}"
    delta = rest[position]
    assert delta["delta"]["stop_reason"] in STOP_REASONS, delta
    message.update(stop_reason=delta["delta"]["stop_reason"], stop_sequence=delta["delta"]["stop_sequence"],
                   usage={**message["usage"], **delta["usage"]})
    for block in message["content"]:
        if block["type"] == "tool_use":
            block["input"] = _input(block.pop("json"), message["stop_reason"])
    Message.model_validate(message)
    return message


def _blocks(events: list[dict], content: list[dict]) -> int:
    """Checks the content blocks' events from the start of `events`, appending the blocks to
    `content`; returns the position of the first event after them."""
    position = 0
    while position < len(events) and events[position]["type"] == "content_block_start":
        start = events[position]
        index = len(content)
        assert start["index"] == index, f"block {index} opened with index {start['index']}"
        block = dict(start["content_block"])
        kind = block["type"]
        assert kind in DELTAS, f"unexpected block type {kind}"
        if kind == "tool_use":
            assert block["input"] == {} and block["id"].startswith("toolu_") and block["name"]
            block["json"] = ""
        else:
            assert block[kind] == "", f"a {kind} block starts empty"
        content.append(block)
        position += 1
        signed = False
        while position < len(events) and events[position]["type"] == "content_block_delta":
            event = events[position]
            delta = event["delta"]
            assert event["index"] == index, f"a delta of block {event['index']} inside block {index}"
            assert delta["type"] in DELTAS[kind], f"{delta['type']} in a {kind} block"
            if delta["type"] == "signature_delta":
                block["signature"], signed = delta["signature"], True
            elif kind == "thinking":
                assert not signed, "thinking_delta after the block's signature_delta"
                block["thinking"] += delta["thinking"]
            elif kind == "text":
                block["text"] += delta["text"]
            else:
                block["json"] += delta["partial_json"]
            position += 1
        if position == len(events):
            return position  # cut short by an error event
        stop = events[position]
        assert stop["type"] == "content_block_stop" and stop["index"] == index, \
            f"block {index} ends with content_block_stop({index}); got {stop}"
        position += 1
    return position


def _input(text: str, stop_reason: str) -> dict:
    """A tool_use block's input from its partial_json pieces: a JSON object, unless cut short."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        assert stop_reason == "max_tokens", f"a tool_use's partial_json pieces are not JSON: {text!r}"
        return {}
    assert isinstance(value, dict), f"a tool_use's input is an object; got {text!r}"
    return value


GREEDY = {"extra_body": {"temperature": 0}}



def stream_text(server, body: dict) -> str:
    """The raw text of a Messages stream."""
    with httpx.stream("POST", f"{server.base_url}/v1/messages", json={"model": MODEL, **body, "stream": True},
                      timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        return r.read().decode()



def streamed(server, body: dict) -> dict:
    """The Message the raw stream builds, its events checked by the grammar checker."""
    return check_stream(parse_sse(stream_text(server, body)))



def sdk_stream(claude, server, body: dict):
    """The SDK's accumulated final Message of a stream of `body` (greedy), and the same stream's
    raw events through the grammar checker: both must agree (tool_use ids aside)."""
    body = {"model": MODEL, **body, "temperature": 0}
    sdk_body = {k: v for k, v in body.items() if k != "temperature"}
    with claude.messages.stream(**sdk_body, **GREEDY) as stream:
        final = stream.get_final_message()
    raw = streamed(server, body)
    assert without_ids(raw["content"]) == without_ids(blocks(final))
    assert (raw["stop_reason"], raw["stop_sequence"]) == (final.stop_reason, final.stop_sequence)
    return final



def blocks(message) -> list[dict]:
    """A Message's content blocks as dicts (the stream helper's ParsedTextBlock as a TextBlock)."""
    return [block.model_dump(exclude_none=True) for block in message.content]


def without_ids(content: list[dict]) -> list[dict]:
    return [{k: v for k, v in block.items() if k != "id"} for block in content]
