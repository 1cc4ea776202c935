"""Structured outputs at the edge: each accepted form becomes one StructuredSpec; every bad one a 400 naming it."""
from __future__ import annotations

import json

import msgspec
import pytest

from rill.asgi.errors import APIError
from rill.asgi.requests.schemas import chat_decoder, completion_decoder
from rill.asgi.requests.structured import json_schema_spec, structured_spec
from rill.ipc.protocol import StructuredKind as K
from rill.ipc.protocol import StructuredSpec

SCHEMA = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}, "required": ["a"]}


def chat(**fields):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return chat_decoder.decode(msgspec.json.encode(body))


def error_of(**fields) -> APIError:
    with pytest.raises(APIError) as info:
        structured_spec(chat(**fields))
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize("fields,kind,value", [
    ({"response_format": {"type": "json_object"}}, K.JSON_OBJECT, ""),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}},
     K.JSON_SCHEMA, SCHEMA),
    ({"structured_outputs": {"json": SCHEMA}}, K.JSON_SCHEMA, SCHEMA),
    ({"structured_outputs": {"json": json.dumps(SCHEMA)}}, K.JSON_SCHEMA, SCHEMA),
    ({"structured_outputs": {"regex": "a+b"}}, K.REGEX, "a+b"),
    ({"structured_outputs": {"choice": ["x", "y"]}}, K.CHOICE, ["x", "y"]),
    ({"structured_outputs": {"grammar": 'root ::= "x"'}}, K.GRAMMAR, 'root ::= "x"'),
    ({"structured_outputs": {"json_object": True, "disable_any_whitespace": True}}, K.JSON_OBJECT, ""),
    ({"guided_json": SCHEMA}, K.JSON_SCHEMA, SCHEMA),
    ({"guided_regex": "[0-9]{3}"}, K.REGEX, "[0-9]{3}"),
    ({"guided_choice": ["a b", 'q"uote']}, K.CHOICE, ["a b", 'q"uote']),
    ({"guided_grammar": 'root ::= "a" | "b"'}, K.GRAMMAR, 'root ::= "a" | "b"'),
])
def test_accepted_forms(fields, kind, value):
    spec = structured_spec(chat(**fields))
    assert spec.kind is kind
    got = json.loads(spec.value) if kind in (K.JSON_SCHEMA, K.CHOICE) else spec.value
    assert got == value
    if kind is K.JSON_SCHEMA:
        assert list(json.loads(spec.value)["properties"]) == ["b", "a"]  # order kept: it is the output's order


def test_no_constraint():
    assert structured_spec(chat()) is None
    assert structured_spec(chat(response_format={"type": "text"})) is None
    assert structured_spec(chat(response_format=None)) is None


def test_completions_take_them_too():
    req = completion_decoder.decode(msgspec.json.encode({"model": "m", "prompt": "x", "guided_regex": "a"}))
    assert structured_spec(req) == StructuredSpec(K.REGEX, "a")


@pytest.mark.parametrize("fields,param", [
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": "json_object"}, "response_format"),
    ({"response_format": {}}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}}, "response_format.json_schema.name"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": "yes"}}},
     "response_format.json_schema.strict"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "response_format.json_schema.schema"),
    ({"guided_json": {"properties": {"a": {"$ref": "#/missing"}}}}, "guided_json"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_regex": "[a-"}, "guided_regex"),
    ({"guided_regex": ""}, "guided_regex"),
    ({"guided_grammar": "root ::= undefined"}, "guided_grammar"),
    ({"guided_grammar": 'root ::= root "a"'}, "guided_grammar"),  # parses, but admits no output
    ({"guided_regex": "[^\\x00-\\U0010FFFF]"}, "guided_regex"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_choice": ["a", 1]}, "guided_choice"),
    ({"structured_outputs": {}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "("}}, "structured_outputs.regex"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag"),
    ({"structured_outputs": "a+"}, "structured_outputs"),
])
def test_bad_constraints_are_400_naming_the_parameter(fields, param):
    assert error_of(**fields).param == param


def test_a_grammar_without_any_output_is_400():
    assert "admits no output" in error_of(guided_grammar='root ::= root "a"').message
    assert structured_spec(chat(guided_grammar='root ::= ""')) is not None  # the empty output is one


@pytest.mark.parametrize("fields,second", [
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
    ({"structured_outputs": {"regex": "a"}, "guided_choice": ["a"]}, "guided_choice"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"json_object": True}}, "structured_outputs"),
])
def test_two_constraints_are_400(fields, second):
    err = error_of(**fields)
    assert err.param == second and "one structured output constraint" in err.message


def test_json_schema_spec_for_tool_calls():
    spec = json_schema_spec({"type": "object", "properties": {"name": {"const": "f"}}})
    assert spec.kind is K.JSON_SCHEMA and json.loads(spec.value)["properties"]["name"] == {"const": "f"}
    with pytest.raises(APIError) as info:
        json_schema_spec({"type": "bogus"})
    assert info.value.param == "tools" and "bogus" in info.value.message
    with pytest.raises(APIError) as info:
        json_schema_spec({"type": "bogus"}, param="tools[0].function.parameters")
    assert info.value.param == "tools[0].function.parameters"


def test_the_grammar_checker_loads_off_the_event_loop(monkeypatch):
    """xgrammar imports torch (seconds): the first constrained request imports it on a thread,
    plain requests never do."""
    import asyncio
    import importlib
    import threading

    import rill.asgi.requests.structured as structured

    imported = []
    monkeypatch.setattr(structured, "_checker_loaded", False)
    monkeypatch.setattr(importlib, "import_module",
                        lambda name: imported.append((name, threading.current_thread() is threading.main_thread())))
    asyncio.run(structured.load_checker(chat()))
    asyncio.run(structured.load_checker(chat(tools=[{"type": "function", "function": {"name": "f"}}],
                                             tool_choice="auto")))
    assert imported == []
    asyncio.run(structured.load_checker(chat(tool_choice="required")))
    assert imported == [("rill.ipc.grammar_spec", False)]
    asyncio.run(structured.load_checker(chat(response_format={"type": "json_object"})))
    assert len(imported) == 1  # once per process
