"""--tool-call-parser auto: the parser picked from the markers a chat template writes calls with."""
from __future__ import annotations

import json

import pytest

from rill.asgi.parsers.tools import TOOL_PARSERS
from rill.asgi.parsers.tools.auto import FORMATS, pick_tool_parser
from rill.asgi.prompt.templating import ChatTemplate
from tests.helpers.parser_checks import check_every_split
from tests.helpers.tool_formats import CALL_RENDERINGS, OUTPUTS, chat_template

CALL = [{"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "user", "content": "Thanks"}]


@pytest.mark.parametrize("fmt", sorted(CALL_RENDERINGS))
def test_each_format_picks_its_own_parser(fmt):
    template = chat_template(fmt)
    assert pick_tool_parser(template) == fmt
    # The template renders a past call the way the model would write it, which the picked parser reads back.
    rendered = ChatTemplate.from_string(template).render(CALL, tools=[{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])
    assert "get_weather" in rendered and "Paris" in rendered


def test_templates_without_calls_pick_none():
    for source in ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}", ""):
        assert pick_tool_parser(source) is None


def test_every_format_names_a_parser_and_every_parser_has_an_output():
    assert {name for name, _ in FORMATS} <= set(TOOL_PARSERS)
    assert set(OUTPUTS) == set(CALL_RENDERINGS) == {name for name, _ in FORMATS}


@pytest.mark.parametrize("fmt", sorted(OUTPUTS))
def test_each_parser_reads_its_formats_output(fmt):
    text, content, calls = OUTPUTS[fmt]
    message = check_every_split(TOOL_PARSERS[fmt], text)
    assert message["content"] == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == calls


def test_the_start_log_names_the_pick(tmp_path, caplog):
    import argparse

    from rill.chat_flags import log_tool_parser

    for fmt, says in (("mistral", "--tool-call-parser auto: mistral, from the chat template"),
                      (None, "shows no tool-call format Rill reads")):
        path = tmp_path / "template.jinja"
        path.write_text(chat_template(fmt) if fmt else "{{ messages[0].content }}")
        caplog.clear()
        with caplog.at_level("INFO", logger="rill"):
            log_tool_parser(argparse.Namespace(tool_call_parser="auto", chat_template=str(path)), tmp_path)
        assert says in caplog.text
