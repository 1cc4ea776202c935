"""The Messages API's tools, tool turns, thinking and `ping` keep-alive, with Anthropic's SDK.

One server for the module: a ChatML template that shows tools and tool turns (the one
tests/e2e/test_tools.py uses), the hermes tool parser with auto tool choice, the deepseek_r1
reasoning parser (this model never writes `</think>`, so all its free text is thinking), and a
10 ms keep-alive (pings come before the first token and between tokens). The bundled model
writes no tool calls by itself: the tool tests force them with tool_choice `tool` or `any`.
"""
from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from tests.helpers.conversations import CONVERSATION, TOOL_TEMPLATE
from tests.helpers.http_calls import MODEL
from tests.helpers.messages_events import GREEDY, blocks, parse_sse, sdk_stream, stream_text, streamed
from tests.helpers.server import start_server, stop_server

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CITY_TOOL = {"name": "get_weather", "description": "Weather of a city", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
    "required": ["city"], "additionalProperties": False}}
TIME_TOOL = {"name": "get_time", "input_schema": {"type": "object", "properties": {}, "additionalProperties": False}}
PING = 'event: ping\ndata: {"type": "ping"}\n\n'


@pytest.fixture(scope="module")
def flagged(model_dir, tmp_path_factory):
    template = tmp_path_factory.mktemp("template") / "tools.jinja"
    template.write_text(TOOL_TEMPLATE)
    srv = start_server(tmp_path_factory, "--max-model-len", "2048", "--chat-template", str(template),
                       "--tool-call-parser", "hermes", "--enable-auto-tool-choice", "--reasoning-parser", "deepseek_r1",
                       "--sse-keepalive", "0.01")
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def tiny_thinker(tmp_path_factory):
    """deepseek_r1 on bench's tiny random-weight model (its bundled tokenizer, seeded weights): a thousand
    tokens cost it a second or two, where the bundled model took half a minute of CI."""
    from rill.bench.serving.tiny_model import write_tiny_model

    tiny = write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")
    srv = start_server(tmp_path_factory, "--model", str(tiny), "--load-format", "dummy", "--served-model-name", MODEL,
                       "--max-model-len", "2048", "--reasoning-parser", "deepseek_r1")
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def claude(flagged):
    return anthropic.Anthropic(base_url=flagged.base_url, api_key="x", _strict_response_validation=True,
                               max_retries=0, timeout=120)


def test_named_tool_is_forced_and_streamed(claude, flagged):
    body = {"max_tokens": 60, "messages": ASK, "tools": [CITY_TOOL, TIME_TOOL],
            "tool_choice": {"type": "tool", "name": "get_weather"}}
    message = claude.messages.create(model=MODEL, **body, **GREEDY)
    [block] = message.content
    assert block.type == "tool_use" and block.name == "get_weather" and block.input["city"] in ("Paris", "Rome")
    assert block.id.startswith("toolu_") and message.stop_reason == "tool_use"
    final = sdk_stream(claude, flagged, body)
    assert final.content[0].input == block.input and final.stop_reason == "tool_use"
    events = parse_sse(stream_text(flagged, {**body, "temperature": 0}))
    start = next(e for name, e in events if name == "content_block_start")
    assert start["content_block"] == {**start["content_block"], "type": "tool_use", "name": "get_weather", "input": {}}
    pieces = [e["delta"]["partial_json"] for name, e in events if name == "content_block_delta"]
    assert len(pieces) > 1  # the input streams as the model writes it


def test_any_tool_with_one_call(claude, flagged):
    body = {"max_tokens": 120, "messages": ASK, "tools": [CITY_TOOL, TIME_TOOL],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True}}
    message = claude.messages.create(model=MODEL, **body, **GREEDY)
    assert [b.type for b in message.content] == ["tool_use"] and message.stop_reason == "tool_use"
    assert message.content[0].name in ("get_weather", "get_time")
    final = sdk_stream(claude, flagged, body)
    assert [(b.name, b.input) for b in final.content] == [(b.name, b.input) for b in message.content]


def test_thinking_blocks(claude, flagged):
    body = {"max_tokens": 12, "messages": ASK, "thinking": {"type": "adaptive"}}
    message = claude.messages.create(model=MODEL, **body, **GREEDY)
    [block] = message.content  # cut short while thinking: no text
    assert block.type == "thinking" and block.thinking and block.signature == ""
    assert message.stop_reason == "max_tokens"
    final = sdk_stream(claude, flagged, body)
    assert blocks(final) == blocks(message)
    kinds = {e["delta"]["type"] for name, e in parse_sse(stream_text(flagged, {**body, "temperature": 0}))
             if name == "content_block_delta"}
    assert kinds == {"thinking_delta", "signature_delta"}
    # enabled, with a budget below max_tokens; a stop sequence ends it early
    enabled = {"max_tokens": 1100, "messages": ASK, "thinking": {"type": "enabled", "budget_tokens": 1024},
               "stop_sequences": [" "]}
    message = claude.messages.create(model=MODEL, **enabled, **GREEDY)
    assert message.stop_reason == "stop_sequence" and all(b.type == "thinking" for b in message.content)
    assert blocks(sdk_stream(claude, flagged, enabled)) == blocks(message)


def test_tool_turns_reach_the_template(claude, flagged):
    # CONVERSATION (tests/unit/test_chat_messages.py) in Anthropic's terms: the same prompt
    turns = [{"role": "user", "content": [{"type": "text", "text": "Weather\nin Paris?"}]},
             {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "get_weather",
                                                "input": {"city": "Paris"}}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "22 C"}]}]
    chat_tools = [{"type": "function", "function": {"name": t["name"], **({"description": t["description"]}
                   if "description" in t else {}), "parameters": t["input_schema"]}} for t in (CITY_TOOL, TIME_TOOL)]
    tokenized = httpx.post(f"{flagged.base_url}/tokenize", timeout=60,
                           json={"model": MODEL, "messages": CONVERSATION, "tools": chat_tools}).json()
    counted = claude.messages.count_tokens(model=MODEL, system="Use tools.", messages=turns,
                                           tools=[CITY_TOOL, TIME_TOOL])
    assert counted.input_tokens == tokenized["count"]
    without_result = claude.messages.count_tokens(model=MODEL, system="Use tools.", messages=turns[:2],
                                                  tools=[CITY_TOOL, TIME_TOOL])
    assert without_result.input_tokens < counted.input_tokens
    # the next turn, as an agent sends it
    message = claude.messages.create(model=MODEL, max_tokens=4, system="Use tools.", messages=turns,
                                     tools=[CITY_TOOL, TIME_TOOL], tool_choice={"type": "none"}, **GREEDY)
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens == counted.input_tokens
    assert message.content and message.content[0].type == "thinking"  # deepseek_r1: free text is thinking


def test_ping_is_the_keepalive(flagged):
    """Before the first token (a long prompt's prefill) and between tokens, the Messages stream
    sends `ping` events; chat on the same server still sends the SSE comment."""
    long_ask = [{"role": "user", "content": "Tell me about the sea. " * 150}]
    text = stream_text(flagged, {"max_tokens": 8, "messages": long_ask, "temperature": 0})
    assert text.startswith(PING) and ": keep-alive" not in text
    assert text.index("event: message_start") > 0
    message = streamed(flagged, {"max_tokens": 8, "messages": long_ask, "temperature": 0})
    assert message["stop_reason"] == "max_tokens" and message["usage"]["output_tokens"] == 8
    with httpx.stream("POST", f"{flagged.base_url}/v1/chat/completions", timeout=120,
                      json={"model": MODEL, "messages": long_ask, "max_tokens": 8, "stream": True}) as r:
        chat = r.read().decode()
    assert ": keep-alive\n\n" in chat and "ping" not in chat


def test_a_thinking_budget_ends_the_thinking_and_the_grammar_holds_the_answer(flagged, tokenizer):
    """deepseek_r1: this model never ends its thinking itself. A budget of 6 tokens writes `</think>` for it;
    the response format applies from there on (think, then constrain), and reasoning_effort none is a budget
    of 0: no thinking, the answer alone."""
    sdk = openai.OpenAI(base_url=f"{flagged.base_url}/v1", api_key="x", _strict_response_validation=True,
                        max_retries=0, timeout=120)
    schema = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
              "required": ["city"], "additionalProperties": False}
    body = dict(model=MODEL, messages=[{"role": "user", "content": "Which city?"}], max_tokens=40, temperature=0,
                response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}})
    budgeted = sdk.chat.completions.create(**body, extra_body={"thinking_token_budget": 6}).choices[0]
    reasoning = budgeted.message.model_extra["reasoning_content"]
    assert 3 <= len(tokenizer.encode(reasoning, add_special_tokens=False).ids) <= 8, reasoning
    assert budgeted.finish_reason == "stop" and json.loads(budgeted.message.content)["city"] in ("Paris", "Rome")
    unbudgeted = sdk.chat.completions.create(**body).choices[0]  # thinks until max_tokens: no answer
    assert unbudgeted.finish_reason == "length" and not unbudgeted.message.content
    none = sdk.chat.completions.create(**body, reasoning_effort="none").choices[0]
    assert none.message.model_extra.get("reasoning_content") is None
    assert json.loads(none.message.content)["city"] in ("Paris", "Rome")


def test_budget_tokens_end_the_thinking_and_the_answer_follows(tiny_thinker, tokenizer):
    """Anthropic's budget_tokens, enforced: the tiny model never ends its thinking itself (deepseek_r1); once 1024
    tokens are spent (Anthropic's least budget) the server writes `</think>`, and a text block follows. Streamed,
    the events checked; the engine's forcing is the same for a body (tests/unit/test_thinking_budget.py). Where the
    thinking ended is read from chat's logprobs for the same greedy request (its text re-tokenized would merge:
    this model thinks in newlines), the closing tag written one token a step from the 1025th on."""
    message = streamed(tiny_thinker, {"max_tokens": 1040, "messages": ASK, "temperature": 0,
                                      "thinking": {"type": "enabled", "budget_tokens": 1024}})
    [thinking, text] = message["content"]
    assert thinking["type"] == "thinking" and text["type"] == "text" and text["text"].strip()
    chat = httpx.post(f"{tiny_thinker.base_url}/v1/chat/completions", timeout=120, json={
        "model": MODEL, "messages": ASK, "max_tokens": 1040, "temperature": 0, "logprobs": True,
        "thinking_token_budget": 1024}).json()["choices"][0]
    tokens = [t["token"] for t in chat["logprobs"]["content"]]
    closing = [tokenizer.decode([i]) for i in tokenizer.encode("</think>", add_special_tokens=False).ids]
    assert tokens[1024:1024 + len(closing)] == closing and "".join(tokens[:1024]).count("</") == 0, tokens[1020:1030]
    assert chat["message"]["reasoning_content"] == thinking["thinking"] and chat["message"]["content"] == text["text"]
