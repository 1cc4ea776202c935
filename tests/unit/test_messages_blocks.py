"""A Message's content blocks from chat's real output parsers, and the Messages stream checker failing on bad streams."""
from __future__ import annotations

import copy

import pydantic
import pytest

from rill.asgi.output.messages_blocks import MessageBlocks
from rill.asgi.output.messages_format import stop_reason
from rill.asgi.parsers.chat_parsing import parser_factory
from rill.asgi.requests.tool_choice import ToolMode, ToolPlan
from tests.helpers.messages_events import check_stream
from tests.helpers.tool_output import OUTPUT, TOOLS, WEATHER

MESSAGE_START = {"type": "message_start", "message": {
    "id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [], "stop_reason": None,
    "stop_sequence": None, "usage": {"input_tokens": 3, "output_tokens": 0}}}


def auto_blocks(max_calls: int | None = None) -> MessageBlocks:
    make = parser_factory(ToolPlan(ToolMode.AUTO, TOOLS, max_calls=max_calls), tool_parser="hermes",
                          reasoning_parser="qwen3")
    return MessageBlocks(make())


def feed(blocks: MessageBlocks, text: str, size: int) -> list[dict]:
    events = []
    for at in range(0, len(text), size):
        events += blocks.push(text[at:at + size])
    return events + blocks.finish()


def stream_of(events: list[dict], reason: str) -> list[tuple[str, dict]]:
    whole = [MESSAGE_START, {"type": "ping"}, *events,
             {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": None},
              "usage": {"output_tokens": 9}}, {"type": "message_stop"}]
    return [(e["type"], e) for e in whole]


def without_ids(content: list[dict]) -> list[dict]:
    return [{k: v for k, v in block.items() if k != "id"} for block in content]


@pytest.mark.parametrize("size", [1, 3, 7, len(OUTPUT)])
def test_blocks_in_the_order_written_and_the_stream_rebuilds_them(size):
    blocks = auto_blocks()
    events = feed(blocks, OUTPUT, size)
    assert [b["type"] for b in blocks.content] == ["thinking", "text", "tool_use", "tool_use"]
    thinking, text, weather, time = blocks.content
    assert thinking == {"type": "thinking", "thinking": "Which city? Paris.", "signature": ""}
    assert text == {"type": "text", "text": "Let me check.\n"}
    assert (weather["name"], weather["input"], time["name"], time["input"]) == ("get_weather", WEATHER, "get_time", {})
    assert weather["id"].startswith("toolu_") and weather["id"] != time["id"]
    reason = stop_reason("stop", None, blocks.num_tool_uses)
    assert reason == "tool_use"
    rebuilt = check_stream(stream_of(events, reason))
    assert rebuilt["content"] == blocks.content and rebuilt["stop_reason"] == "tool_use"
    assert without_ids(blocks.content) == without_ids(_whole())  # however the text was split


def _whole() -> list[dict]:
    blocks = auto_blocks()
    feed(blocks, OUTPUT, len(OUTPUT))
    return blocks.content


def test_disable_parallel_tool_use_keeps_the_first_call():
    blocks = auto_blocks(max_calls=1)
    events = feed(blocks, OUTPUT, 5)
    assert [b["type"] for b in blocks.content] == ["thinking", "text", "tool_use"]
    assert check_stream(stream_of(events, "tool_use"))["content"] == blocks.content


def test_a_call_cut_short_has_an_empty_input():
    blocks = MessageBlocks(parser_factory(ToolPlan(ToolMode.NAMED, TOOLS, function_name="get_weather"),
                                          tool_parser=None, reasoning_parser=None)())
    events = feed(blocks, '{"city": "Pa', 4)
    assert blocks.content[0]["input"] == {} and blocks.content[0]["name"] == "get_weather"
    assert stop_reason("length", None, 1) == "max_tokens"
    check_stream(stream_of(events, "max_tokens"))
    with pytest.raises(AssertionError, match="not JSON"):  # a finished call must be whole JSON
        check_stream(stream_of(events, "tool_use"))


def test_no_output_no_blocks_and_finish_once():
    blocks = auto_blocks()
    assert blocks.finish() == [] and blocks.finish() == [] and blocks.content == []
    assert stop_reason("stop", None, 0) == "end_turn" and stop_reason("stop", "END", 0) == "stop_sequence"


def good_events() -> list[dict]:
    return feed(auto_blocks(), OUTPUT, 6)


def _drop_first(kind):
    return lambda ev: ev.remove(next(e for e in ev if e["type"] == kind))


def _swap_stop_and_next_start(ev):
    at = next(i for i, e in enumerate(ev) if e["type"] == "content_block_stop")
    ev[at], ev[at + 1] = ev[at + 1], ev[at]


def _move_signature_first(ev):
    at = next(i for i, e in enumerate(ev) if e.get("delta", {}).get("type") == "signature_delta")
    ev.insert(1, ev.pop(at))


def _set(pos, **fields):
    def mutate(ev):
        ev[pos] = {**ev[pos], **fields}
    return mutate


def _text_delta_in_tool(ev):
    at = next(i for i, e in enumerate(ev) if e.get("delta", {}).get("type") == "input_json_delta")
    ev[at] = {**ev[at], "delta": {"type": "text_delta", "text": "x"}}


def _bad_json(ev):
    at = next(i for i, e in enumerate(ev) if e.get("delta", {}).get("type") == "input_json_delta")
    ev[at] = {**ev[at], "delta": {"type": "input_json_delta", "partial_json": "]"}}


@pytest.mark.parametrize("mutate", [
    _drop_first("content_block_stop"),
    _drop_first("content_block_start"),
    _swap_stop_and_next_start,  # blocks interleaved
    _move_signature_first,  # thinking after the signature
    _set(0, index=1),  # the first block at index 1
    _set(1, index=1),  # a delta of another block
    _text_delta_in_tool,
    _bad_json,
    lambda ev: ev.append({"type": "content_block_stop", "index": 99}),
], ids=["no-stop", "no-start", "interleaved", "signature-first", "start-index", "delta-index", "delta-kind",
        "bad-json", "stray-stop"])
def test_the_checker_fails_bad_block_sequences(mutate):
    events = copy.deepcopy(good_events())
    check_stream(stream_of(copy.deepcopy(events), "tool_use"))  # the good stream passes
    mutate(events)
    with pytest.raises((AssertionError, pydantic.ValidationError)):
        check_stream(stream_of(events, "tool_use"))


@pytest.mark.parametrize("mutate", [
    lambda s: s.pop(0),  # no message_start
    lambda s: s.insert(3, s.pop(0)),  # message_start late
    lambda s: s.pop(-1),  # no message_stop
    lambda s: s.pop(-2),  # no message_delta
    lambda s: s.insert(-1, s[-2]),  # two message_delta
    lambda s: s.insert(3, s[-2]),  # message_delta among the blocks
    lambda s: s.append(("message_stop", {"type": "message_stop"})),  # something after message_stop
    lambda s: s.insert(2, ("error", {"type": "error", "error": {"type": "api_error", "message": "x"}})),
    lambda s: s.insert(1, ("ping", {"type": "ping", "x": 1})),
    lambda s: s.insert(1, ("text", {"type": "ping"})),  # the event line differs from the type
], ids=["no-start", "late-start", "no-stop", "no-delta", "two-deltas", "delta-early", "after-stop", "error-mid",
        "odd-ping", "name-mismatch"])
def test_the_checker_fails_bad_message_sequences(mutate):
    stream = stream_of(good_events(), "tool_use")
    mutate(stream)
    with pytest.raises((AssertionError, pydantic.ValidationError)):
        check_stream(stream)


def test_an_error_event_may_end_the_stream():
    stream = stream_of(good_events(), "tool_use")[:5]
    stream.append(("error", {"type": "error", "error": {"type": "api_error", "message": "engine died"}}))
    assert check_stream(stream)["error"]["message"] == "engine died"
