"""Chat templates, tool calls and reasoning through a real `rill serve` and the strict OpenAI SDK.

One server for the module: a ChatML template that shows tools (--chat-template), the tool parser
picked from the chat template (`auto`: hermes for the served one, each format's own for a request's
template) with auto tool choice, the qwen3 reasoning parser, and request templates trusted.
The bundled model writes neither tool calls nor think tags by itself: the tests that need them
force its text with the grammar (a regex, or tool_choice required or named).
"""
from __future__ import annotations

import json
import subprocess

import httpx
import openai
import pytest

from rill.bench.serving.servers import RILL
from tests.helpers.conversations import CONVERSATION, TOOL_TEMPLATE, TOOLS
from tests.helpers.openapi import validate
from tests.helpers.server import start_server, stop_server
from tests.helpers.tool_formats import OUTPUTS, chat_template, literal_regex

MODEL = "smollm2-135m-instruct"
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
CITY_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
    "required": ["city"], "additionalProperties": False}}}
TIME_TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {}, "additionalProperties": False}}}


@pytest.fixture(scope="module")
def tool_server(model_dir, tmp_path_factory):
    template = tmp_path_factory.mktemp("template") / "tools.jinja"
    template.write_text(TOOL_TEMPLATE)
    srv = start_server(tmp_path_factory, "--max-model-len", "1024", "--chat-template", str(template),
                       "--tool-call-parser", "auto", "--enable-auto-tool-choice", "--reasoning-parser", "qwen3",
                       "--trust-request-chat-template",
                       "--default-chat-template-kwargs", '{"rill_greeting": "from the server", "rill_other": 1}')
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def sdk(tool_server):
    return openai.OpenAI(base_url=f"{tool_server.base_url}/v1", api_key="unused", _strict_response_validation=True,
                         max_retries=0, timeout=120)


def prompt_of(server, tokenizer, **body) -> str:
    r = httpx.post(f"{server.base_url}/tokenize", json={"model": MODEL, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return tokenizer.decode(r.json()["tokens"], skip_special_tokens=False)


def post_chat(server, **body) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/chat/completions", json={"model": MODEL, **body}, timeout=120)


def streamed(sdk, **body):
    """(the deltas' content, reasoning and tool calls joined by index, the finish reason)."""
    content, reasoning, calls, finish = [], [], {}, None
    for chunk in sdk.chat.completions.create(model=MODEL, stream=True, **body):
        validate("CreateChatCompletionStreamResponse", chunk.model_dump(exclude_unset=True))
        for choice in chunk.choices:
            delta = choice.delta
            content.append(delta.content or "")
            reasoning.append((delta.model_extra or {}).get("reasoning_content") or "")
            for piece in delta.tool_calls or []:
                call = calls.setdefault(piece.index, {"id": piece.id, "name": piece.function.name, "arguments": ""})
                if piece.id is not None:
                    assert piece.type == "function" and piece.function.name and call["id"] == piece.id
                call["arguments"] += piece.function.arguments or ""
            finish = choice.finish_reason or finish
    return "".join(content) or None, "".join(reasoning) or None, [calls[i] for i in sorted(calls)], finish


def raw_frames(server, **body) -> list[dict]:
    """The stream's JSON frames as sent, each checked against OpenAI's chunk schema."""
    frames = []
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json={"model": MODEL, "stream": True, **body},
                      timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                frames.append(json.loads(line[6:]))
                validate("CreateChatCompletionStreamResponse", frames[-1])
    return frames


def as_streamed(message) -> list[dict]:
    return [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in message.tool_calls or []]


def test_bad_chat_flags_fail_at_start(tmp_path):
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m.content }")
    for flags, words in ((["--chat-template", str(broken)], "--chat-template"),
                         (["--chat-template", str(tmp_path / "missing.jinja")], "no such file"),
                         (["--enable-auto-tool-choice"], "--tool-call-parser"),
                         (["--default-chat-template-kwargs", '{"tools": []}'], "must not set ['tools']"),
                         (["--default-chat-template-kwargs", "[1]"], "--default-chat-template-kwargs: a JSON object")):
        done = subprocess.run([str(RILL), "serve", *flags], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and words in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr


def test_default_chat_template_kwargs_reach_the_template_under_the_requests_own(tool_server, tokenizer):
    template = "{{ rill_greeting }}/{{ rill_other }}|{% for m in messages %}{{ m.content }}{% endfor %}"
    assert prompt_of(tool_server, tokenizer, messages=USER, chat_template=template).startswith("from the server/1|")
    mine = prompt_of(tool_server, tokenizer, messages=USER, chat_template=template,
                     chat_template_kwargs={"rill_greeting": "mine"})
    assert mine.startswith("mine/1|What is the weather")


def test_documents_reach_a_rag_template(tool_server, tokenizer, sdk):
    """vLLM's chat `documents`: what a RAG template (Granite's, Command R's) renders; None without them, as HF's."""
    template = ("{% if documents is none %}none{% else %}{% for d in documents %}[{{ d.title }}: {{ d.text }}]"
                "{% endfor %}{% endif %}|{% for m in messages %}{{ m.content }}{% endfor %}")
    docs = [{"title": "A", "text": "x"}, {"title": "B", "text": "y"}]
    assert prompt_of(tool_server, tokenizer, messages=USER, chat_template=template,
                     documents=docs).startswith("[A: x][B: y]|What is the weather")
    assert prompt_of(tool_server, tokenizer, messages=USER, chat_template=template).startswith("none|")
    answer = sdk.chat.completions.create(model=MODEL, messages=USER, max_tokens=2, extra_body={"documents": docs})
    assert answer.choices[0].message.content is not None
    for bad, param in (([{"title": 1}], "documents[0]"), ([{"x": "y"}] * 257, "documents")):
        error = post_chat(tool_server, messages=USER, documents=bad).json()["error"]
        assert error["param"] == param, error
    via_kwargs = post_chat(tool_server, messages=USER, chat_template_kwargs={"documents": docs}).json()["error"]
    assert via_kwargs["param"] == "chat_template_kwargs"  # the request field, as for tools


def test_template_gets_tools_and_tool_turns(tool_server, tokenizer, sdk):
    prompt = prompt_of(tool_server, tokenizer, messages=CONVERSATION, tools=TOOLS)
    assert json.dumps(TOOLS[0]) in prompt
    assert prompt.startswith("<|im_start|>system\n<tools>")
    assert "<|im_start|>system\nUse tools.<|im_end|>" in prompt  # developer, as system for this template
    assert "<|im_start|>user\nWeather\nin Paris?<|im_end|>" in prompt
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}} [city=Paris]</tool_call>' in prompt
    assert '<tool_response id="call_1">22 C</tool_response>' in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    # The same conversation as a chat completion (auto: the model's plain text stays content).
    raw = post_chat(tool_server, messages=CONVERSATION, tools=TOOLS, max_tokens=8, temperature=0)
    assert raw.status_code == 200, raw.text
    validate("CreateChatCompletionResponse", raw.json())
    resp = sdk.chat.completions.create(model=MODEL, messages=CONVERSATION, tools=TOOLS, max_tokens=8, temperature=0)
    assert resp.choices[0].message.content == raw.json()["choices"][0]["message"]["content"]
    assert resp.choices[0].message.tool_calls is None and resp.choices[0].finish_reason == "length"


def test_continue_final_message_and_request_template(tool_server, tokenizer):
    turns = [{"role": "user", "content": "Count to three."}, {"role": "assistant", "content": "One, two,"}]
    prompt = prompt_of(tool_server, tokenizer, messages=turns, continue_final_message=True)
    assert prompt.endswith("<|im_start|>assistant\nOne, two,")
    both = post_chat(tool_server, messages=turns, continue_final_message=True, add_generation_prompt=True)
    assert both.status_code == 400 and both.json()["error"]["param"] == "continue_final_message"
    mine = "{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
    assert prompt_of(tool_server, tokenizer, messages=turns, chat_template=mine) == "[user:Count to three.][assistant:One, two,]"
    broken = post_chat(tool_server, messages=turns, chat_template="{% if %}")
    assert broken.status_code == 400 and broken.json()["error"]["param"] == "chat_template"


@pytest.mark.parametrize("body,param", [
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "tool", "content": "22 C"}]}, "messages[0].tool_call_id"),
    ({"messages": USER, "tool_choice": "required"}, "tool_choice"),
    ({"messages": USER, "tools": [CITY_TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"messages": USER, "tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools[0].type"),
])
def test_bad_requests_name_the_param(tool_server, body, param):
    r = post_chat(tool_server, **body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    validate("ErrorResponse", r.json())


def test_auto_tool_call_after_reasoning(sdk, tool_server):
    # The grammar writes what a thinking, tool-calling model would; the parsers take it apart.
    regex = (r'<think>[a-z ]{1,24}</think>\n<tool_call>\n\{"name": "get_weather", "arguments": '
             r'\{"city": "(Paris|Rome)"\}\}\n</tool_call>')
    body = dict(messages=USER, tools=[CITY_TOOL, TIME_TOOL], temperature=0, max_tokens=100,
                extra_body={"structured_outputs": {"regex": regex}})
    resp = sdk.chat.completions.create(model=MODEL, **body)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.model_extra["reasoning_content"]
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Rome")
    content, reasoning, calls, finish = streamed(sdk, **body)
    assert (content, reasoning, finish) == (None, choice.message.model_extra["reasoning_content"], "tool_calls")
    frames = raw_frames(tool_server, **{k: v for k, v in body.items() if k != "extra_body"}, **body["extra_body"])
    first = next(f["choices"][0]["delta"]["tool_calls"][0] for f in frames if f["choices"][0]["delta"].get("tool_calls"))
    assert set(first) == {"index", "id", "type", "function"} and first["function"]["name"] == "get_weather"
    assert [{**c, "id": None} for c in calls] == [{**c, "id": None} for c in as_streamed(choice.message)]


def test_parallel_tool_calls_false_keeps_the_first_call(sdk):
    """The grammar writes two calls; with parallel_tool_calls false and tool_choice auto only the
    first comes back, streamed or not (issue 30)."""
    regex = (r'<think>[a-z ]{1,8}</think>\n<tool_call>\n\{"name": "get_weather", "arguments": '
             r'\{"city": "Paris"\}\}\n</tool_call>\n<tool_call>\n\{"name": "get_time", "arguments": \{\}\}\n</tool_call>')
    body = dict(messages=USER, tools=[CITY_TOOL, TIME_TOOL], temperature=0, max_tokens=120,
                extra_body={"structured_outputs": {"regex": regex}})
    both = sdk.chat.completions.create(model=MODEL, **body).choices[0].message.tool_calls
    assert [c.function.name for c in both] == ["get_weather", "get_time"]
    first = sdk.chat.completions.create(model=MODEL, parallel_tool_calls=False, **body).choices[0]
    assert first.finish_reason == "tool_calls" and [c.function.name for c in first.message.tool_calls] == ["get_weather"]
    _, _, calls, finish = streamed(sdk, parallel_tool_calls=False, **body)
    assert [c["name"] for c in calls] == ["get_weather"] and finish == "tool_calls"


def test_named_tool_choice_forces_the_arguments(sdk, tool_server):
    body = dict(messages=USER, tools=[CITY_TOOL, TIME_TOOL], temperature=0, max_tokens=60,
                tool_choice={"type": "function", "function": {"name": "get_weather"}})
    raw = post_chat(tool_server, **body)
    validate("CreateChatCompletionResponse", raw.json())
    choice = sdk.chat.completions.create(model=MODEL, **body).choices[0]
    assert choice.finish_reason == "stop"  # as OpenAI and vLLM for a named function
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] in ("Paris", "Rome")
    content, _, calls, finish = streamed(sdk, **body)
    assert (content, finish) == (None, "stop")
    assert [{**c, "id": None} for c in calls] == [{**c, "id": None} for c in as_streamed(choice.message)]


def test_required_tool_choice_forces_calls(sdk):
    body = dict(messages=USER, tools=[CITY_TOOL, TIME_TOOL], temperature=0, max_tokens=120, tool_choice="required")
    choice = sdk.chat.completions.create(model=MODEL, **body).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.function.name in ("get_weather", "get_time")
        assert isinstance(json.loads(call.function.arguments), dict)
    content, _, calls, finish = streamed(sdk, **body)
    assert (content, finish) == (None, "tool_calls")
    assert [{**c, "id": None} for c in calls] == [{**c, "id": None} for c in as_streamed(choice.message)]


def weather_shots(*cities: str, ids: str = "call_{}") -> list[dict]:
    """Past turns in which the assistant called get_weather for each city (the calls' ids `ids` of their index):
    the bundled model then writes such a call itself (no grammar forces it), for the question that follows, on
    Lisbon."""
    messages = []
    for i, city in enumerate(cities):
        messages += [{"role": "user", "content": f"What is the weather in {city}?"},
                     {"role": "assistant", "content": None, "tool_calls": [{"id": ids.format(i), "type": "function",
                      "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}]},
                     {"role": "tool", "tool_call_id": ids.format(i), "content": "Sunny."},
                     {"role": "assistant", "content": "It is sunny."}]
    return [*messages, {"role": "user", "content": "What is the weather in Lisbon?"}]


def weather(strict: bool) -> dict:
    """get_weather, whose city may only be Rome where `strict`."""
    city = {"type": "string", "enum": ["Rome"]} if strict else {"type": "string"}
    return {"type": "function", "function": {"name": "get_weather", "strict": strict, "parameters": {
        "type": "object", "properties": {"city": city}, "required": ["city"], "additionalProperties": False}}}


def test_a_strict_function_holds_the_call_the_model_chose_to_make(sdk, tool_server):
    """tool_choice auto: the model opens a call by itself; with `strict` its arguments follow the schema from
    there on (a grammar triggered by `<tool_call>`), which allows only Rome; without, it writes Lisbon."""
    body = dict(messages=weather_shots("Paris", "Berlin"), temperature=0, max_tokens=60)
    free = sdk.chat.completions.create(model=MODEL, tools=[weather(False)], **body).choices[0]
    assert [json.loads(c.function.arguments) for c in free.message.tool_calls] == [{"city": "Lisbon"}]
    held = sdk.chat.completions.create(model=MODEL, tools=[weather(True)], **body).choices[0]
    assert held.finish_reason == "tool_calls"
    assert [json.loads(c.function.arguments) for c in held.message.tool_calls] == [{"city": "Rome"}]
    _, _, calls, finish = streamed(sdk, tools=[weather(True)], **body)
    assert [json.loads(c["arguments"]) for c in calls] == [{"city": "Rome"}] and finish == "tool_calls"
    # The Responses API: the same history as items, the same strict function.
    items = []
    for m in body["messages"]:
        if m.get("tool_calls"):
            items += [{"type": "function_call", "call_id": c["id"], "name": c["function"]["name"],
                       "arguments": c["function"]["arguments"]} for c in m["tool_calls"]]
        elif m["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"]})
        else:
            items.append({"role": m["role"], "content": m["content"]})
    tool = weather(True)["function"]
    response = sdk.responses.create(model=MODEL, input=items, temperature=0, max_output_tokens=60,
                                    tools=[{"type": "function", **tool}])
    [call] = [i for i in response.output if i.type == "function_call"]
    assert json.loads(call.arguments) == {"city": "Rome"}


@pytest.mark.parametrize("fmt", ["qwen3_coder", "glm45", "kimi_k2", "gemma4", "granite", "hunyuan_a13b", "openai"])
def test_a_strict_function_holds_a_call_in_the_template_s_format(sdk, fmt):
    """The same where the request's template writes calls in an XML format: from the model's `<tool_call>` on, the
    call is the template's text and its parameters are held to the schema in that format. Kimi's call ids hold
    an index the model writes (its template writes them back); harmony's grammar is the whole output's (its
    markers text here: the bundled tokenizer has none of them)."""
    ids = "functions.get_weather:{}" if fmt == "kimi_k2" else "call_{}"
    body = dict(messages=weather_shots("Paris", "Berlin", ids=ids), temperature=0, max_tokens=120,
                extra_body={"chat_template": chat_template(fmt)})
    free = sdk.chat.completions.create(model=MODEL, tools=[weather(False)], **body).choices[0]
    assert [json.loads(c.function.arguments) for c in free.message.tool_calls] == [{"city": "Lisbon"}]
    held = sdk.chat.completions.create(model=MODEL, tools=[weather(True)], **body).choices[0]
    assert held.finish_reason == "tool_calls"
    assert [json.loads(c.function.arguments) for c in held.message.tool_calls] == [{"city": "Rome"}]
    if fmt == "kimi_k2":
        assert [c.id for c in held.message.tool_calls] == ["functions.get_weather:2"]


# Seven formats of different kinds (XML typed by the schema, GLM's keys and values, a marker and a name, special
# markers with a fenced block, Kimi's with the model's own ids, Python calls, harmony's channels); every parser reads
# every split of its format in tests/unit, and hermes runs through this server above.
@pytest.mark.parametrize("fmt", ["qwen3_coder", "glm45", "mistral", "deepseek_v3", "kimi_k2", "pythonic", "openai"])
def test_auto_reads_each_format_its_request_template_writes(sdk, fmt):
    """--tool-call-parser auto picks the parser from the request's own chat template (the served one's
    is hermes); the grammar writes the format's calls, after an empty thinking. Harmony's channels carry the
    thinking themselves (its parser replaces the qwen3 reasoning parser): its analysis is the reasoning."""
    text, content, calls = OUTPUTS[fmt]
    thinking = "" if fmt == "openai" else "<think></think>"
    body = dict(messages=USER, tools=[CITY_TOOL, TIME_TOOL], temperature=0, max_tokens=400,
                extra_body={"chat_template": chat_template(fmt),
                            "structured_outputs": {"regex": literal_regex(thinking + text)}})
    choice = sdk.chat.completions.create(model=MODEL, **body).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == content
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == calls
    if fmt == "kimi_k2":  # the ids the model wrote, which Kimi's template writes back into the next turn
        assert [c.id for c in choice.message.tool_calls] == ["functions.get_weather:0", "functions.get_time:1"]
    reasoning = choice.message.model_extra.get("reasoning_content")
    assert reasoning == ("Two calls." if fmt == "openai" else None)
    if fmt in ("mistral", "openai"):  # streamed too (every split of each is a unit test)
        streamed_content, streamed_reasoning, streamed_calls, finish = streamed(sdk, **body)
        assert (streamed_content, streamed_reasoning, finish) == (content, reasoning, "tool_calls")
        assert [(c["name"], json.loads(c["arguments"])) for c in streamed_calls] == calls


def test_auto_without_a_known_format_is_a_400_naming_tool_choice(tool_server):
    plain = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    r = post_chat(tool_server, messages=USER, tools=[CITY_TOOL], chat_template=plain)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice", r.text
    assert "no tool-call format" in r.json()["error"]["message"]
    assert post_chat(tool_server, messages=USER, tools=[CITY_TOOL], tool_choice="none", chat_template=plain,
                     max_tokens=2).status_code == 200
