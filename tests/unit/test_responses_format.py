"""ResponseBuilder without a server: reasoning, text and tool calls as output items and events; input items."""
from __future__ import annotations

import pytest

from rill.asgi.engine_link.generate import ChoiceDelta, Usage
from rill.asgi.errors import APIError
from rill.asgi.output.responses_format import ResponseBuilder, sse_event
from rill.asgi.requests.reasoning_blob import PREFIX, seal, unseal
from rill.asgi.requests.responses_input import items_to_messages
from tests.helpers.responses_events import check_stream, parse_sse

FIELDS = {"id": "resp_1", "model": "m", "instructions": None, "max_output_tokens": None, "parallel_tool_calls": True,
          "previous_response_id": None, "reasoning": {"effort": None, "summary": None}, "store": True,
          "temperature": 1.0, "top_p": 1.0, "text": {"format": {"type": "text"}}, "tool_choice": "auto", "tools": [],
          "truncation": "disabled", "metadata": {}, "service_tier": "default", "conversation": None,
          "moderation": None, "prompt_cache_options": {"ttl": "30m", "mode": "implicit"}}


class ScriptedParser:
    """Returns the delta fields it was given for each pushed text, in order."""

    called_tools = False

    def __init__(self, script: list[dict]):
        self.script = list(script)

    def push(self, text: str) -> dict:
        return self.script.pop(0)

    def finish(self) -> dict:
        return {}


def run(script: list[dict], finish: str = "stop", sealed: bool = False) -> tuple[list[dict], dict]:
    builder = ResponseBuilder(dict(FIELDS), ScriptedParser(script), None, sealed_reasoning=sealed)
    builder.usage = Usage(prompt_tokens=5)
    events = builder.start()
    for i in range(len(script)):
        events += builder.push(ChoiceDelta(0, "x", finish if i == len(script) - 1 else None))
    events += builder.finish(finish, Usage(prompt_tokens=5, completion_tokens=len(script)))
    # through the wire framing and back, as a client reads it
    lines = b"".join(sse_event(e) for e in events).decode().splitlines()
    return events, check_stream(parse_sse(lines))


def test_reasoning_then_text_then_two_calls():
    events, response = run([
        {"reasoning_content": "Let me "}, {"reasoning_content": "think."},
        {"content": "Calling."},
        {"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "f", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"a": 1}'}}]},
        {"tool_calls": [{"index": 1, "id": "call_b", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
    ])
    assert [i["type"] for i in response["output"]] == ["reasoning", "message", "function_call", "function_call"]
    assert response["output"][0]["content"][0]["text"] == "Let me think."
    assert response["output_text"] == "Calling."
    assert [(c["call_id"], c["name"], c["arguments"]) for c in response["output"][2:]] == [
        ("call_a", "f", '{"a": 1}'), ("call_b", "g", "{}")]
    assert response["status"] == "completed" and response["usage"]["output_tokens_details"]["reasoning_tokens"] > 0
    assert "response.reasoning_text.delta" in [e["type"] for e in events]


def test_no_output_still_has_a_message_and_length_is_incomplete():
    _, response = run([{}], finish="length")
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["output"][0]["type"] == "message" and response["output_text"] == ""


def test_output_items_chain_back_into_messages():
    _, response = run([{"reasoning_content": "hmm"}, {"content": "Hi."},
                       {"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                        "function": {"name": "f", "arguments": "{}"}}]}])
    messages = items_to_messages(response["output"], "output")
    assert messages == [{"role": "assistant", "content": "Hi.", "reasoning": "hmm",
                         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]


def test_input_item_errors_name_the_item():
    with pytest.raises(APIError) as info:
        items_to_messages([{"type": "function_call", "call_id": "c", "name": "f"}])
    assert info.value.param == "input[0].arguments"
    with pytest.raises(APIError) as info:
        items_to_messages([{"type": "message", "role": "tool", "content": "x"}])
    assert info.value.param == "input[0].role"


def test_sealed_reasoning_comes_back_into_the_prompt():
    """include reasoning.encrypted_content (Codex CLI, the Agents SDK, with store false): each reasoning item carries
    its text sealed, in the Response and in its output_item.done event; sent back with no content (as such clients
    send it), the text is the next assistant message's reasoning again."""
    thought = "Ünïcode thoughts, \n and a second line."
    events, response = run([{"reasoning_content": thought}, {"content": "Hi."}], sealed=True)
    item = response["output"][0]
    assert item["encrypted_content"].startswith(PREFIX) and unseal(item["encrypted_content"], "x") == thought
    done = [e for e in events if e["type"] == "response.output_item.done" and e["item"]["type"] == "reasoning"]
    assert done[0]["item"]["encrypted_content"] == item["encrypted_content"]
    carried = [{"type": "reasoning", "id": item["id"], "summary": [], "encrypted_content": item["encrypted_content"]},
               {"type": "message", "role": "assistant", "content": "Hi."}]
    assert items_to_messages(carried)[0] == {"role": "assistant", "content": "Hi.", "reasoning": thought}
    assert "encrypted_content" not in run([{"reasoning_content": thought}])[1]["output"][0]  # not asked for
    # content wins over the blob, the blob over the summary; another server's blob is passed over
    both = [{**carried[0], "content": [{"type": "reasoning_text", "text": "shown"}]}, carried[1]]
    assert items_to_messages(both)[0]["reasoning"] == "shown"
    summary = [{**carried[0], "summary": [{"type": "summary_text", "text": "short"}]}, carried[1]]
    assert items_to_messages(summary)[0]["reasoning"] == thought
    foreign = [{**summary[0], "encrypted_content": "gAAAAABoOpenAIs"}, carried[1]]
    assert items_to_messages(foreign)[0]["reasoning"] == "short"
    assert seal("") == PREFIX and unseal(None, "x") == ""


@pytest.mark.parametrize("blob", [PREFIX + "%%%", PREFIX + "gA", PREFIX + "_w=="])  # not base64; cut; not UTF-8
def test_a_blob_of_rills_that_does_not_decode_is_a_400_naming_it(blob):
    with pytest.raises(APIError) as info:
        items_to_messages([{"type": "message", "role": "user", "content": "x"},
                           {"type": "reasoning", "summary": [], "encrypted_content": blob}])
    assert info.value.status == 400 and info.value.param == "input[1].encrypted_content"
