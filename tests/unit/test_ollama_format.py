"""Ollama's answer (asgi/output/ollama_format.py) from chat's real output parsers: the NDJSON stream's pieces, tool
calls whole with object arguments, the last object's counts; the body the same message; and the requests' mapping
(asgi/requests/ollama_request.py): tool turns answered in order, options, format and think."""
from __future__ import annotations

import json
from types import SimpleNamespace

import msgspec
import pytest

from rill.asgi.engine_link.generate import ChoiceDelta, Usage
from rill.asgi.output.ollama_format import OllamaAnswer
from rill.asgi.parsers.chat_parsing import parser_factory
from rill.asgi.requests.ollama_request import chat_decoder, chat_messages, chat_request, max_tokens
from rill.asgi.requests.tool_choice import ToolMode, ToolPlan
from tests.helpers.tool_output import OUTPUT, TOOLS, WEATHER


def answer() -> OllamaAnswer:
    make = parser_factory(ToolPlan(ToolMode.AUTO, TOOLS), tool_parser="hermes", reasoning_parser="qwen3")
    return OllamaAnswer("m", make(), chat=True)


def gen() -> SimpleNamespace:
    """What the shape reads of a Generation: its usage, and whether the client left."""
    return SimpleNamespace(usage=lambda: Usage(prompt_tokens=7, completion_tokens=40), disconnected=False)


def deltas(size: int) -> list[list[ChoiceDelta]]:
    pieces = [[ChoiceDelta(0, OUTPUT[at:at + size])] for at in range(0, len(OUTPUT), size)]
    return [*pieces, [ChoiceDelta(0, "", finish_reason="stop")]]


@pytest.mark.parametrize("size", [1, 7, len(OUTPUT)])
def test_a_stream_of_thinking_text_then_the_calls_whole(size):
    shape, g = answer(), gen()
    lines = [json.loads(raw) for step in deltas(size) for raw in shape.frames(step, g)]
    lines += [json.loads(raw) for raw in shape.closing(g)]
    assert all(raw["model"] == "m" and raw["created_at"].endswith("Z") for raw in lines)
    messages = [raw["message"] for raw in lines]
    assert "".join(m.get("thinking", "") for m in messages) == "Which city? Paris."
    assert "".join(m["content"] for m in messages) == "Let me check.\n"
    calls = [m["tool_calls"] for m in messages if "tool_calls" in m]
    assert calls == [[{"function": {"name": "get_weather", "arguments": WEATHER}},
                      {"function": {"name": "get_time", "arguments": {}}}]]
    assert [raw["done"] for raw in lines] == [False] * (len(lines) - 1) + [True]
    last = lines[-1]
    assert (last["done_reason"], last["prompt_eval_count"], last["eval_count"]) == ("stop", 7, 40)
    assert last["total_duration"] >= last["eval_duration"] >= 0


def test_the_body_is_the_whole_message():
    shape, g = answer(), gen()
    for step in deltas(5):
        shape.add(step)
    body = json.loads(shape.body(g))
    assert body["done"] is True and body["message"]["content"] == "Let me check.\n"
    assert body["message"]["thinking"] == "Which city? Paris." and len(body["message"]["tool_calls"]) == 2


def test_generate_answers_in_response_with_its_context():
    shape = OllamaAnswer("m", parser_factory(ToolPlan(ToolMode.NONE, []), tool_parser=None, reasoning_parser=None)(),
                         chat=False, context=[1, 2])
    g = gen()
    lines = shape.frames([ChoiceDelta(0, "Hi", token_ids=[5]), ChoiceDelta(0, " there", "length", token_ids=[6])], g)
    assert [json.loads(raw)["response"] for raw in lines] == ["Hi", " there"]
    last = json.loads(shape.closing(g)[-1])
    assert last["context"] == [1, 2, 5, 6] and last["done_reason"] == "length" and "message" not in last


def test_a_request_maps_onto_chat():
    req = msgspec.json.decode(json.dumps({
        "model": "m", "think": "high", "format": "json", "options": {"num_predict": -1, "temperature": 0.2, "top_k": 0,
                                                                      "repeat_penalty": 1.1, "num_ctx": 4096},
        "messages": [{"role": "user", "content": "Weather?"},
                     {"role": "assistant", "content": "", "tool_calls": [
                         {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                         {"function": {"name": "get_time", "arguments": {}}}]},
                     {"role": "tool", "content": "12C", "tool_name": "get_weather"},
                     {"role": "tool", "content": "noon", "tool_name": "get_time"}]}).encode(), type=chat_decoder.type)
    messages = chat_messages(req)
    calls = messages[1].tool_calls
    assert [c.id for c in calls] == [m.tool_call_id for m in messages[2:]]  # each result answers its call, in order
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    chat = chat_request(req, messages)
    assert (chat.temperature, chat.top_k, chat.repetition_penalty, chat.reasoning_effort) == (0.2, None, 1.1, "high")
    assert chat.response_format == {"type": "json_object"} and max_tokens(req) is None
