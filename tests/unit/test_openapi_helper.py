"""tests/helpers/openapi.py: OpenAI's schemas accept real response shapes and reject broken ones."""

from __future__ import annotations

import copy

import jsonschema
import pytest

try:
    # The name other tests use: one module object, so the spec is parsed once per process.
    from tests.helpers import openapi
except ImportError:  # run as `pytest` without the repo root on sys.path
    import openapi

USAGE = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
CHAT_COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1741570283,
    "model": "smollm2-135m-instruct",
    "choices": [{
        "index": 0,
        "message": {"role": "assistant", "content": "Hello!", "refusal": None},
        "logprobs": None,
        "finish_reason": "stop",
    }],
    "usage": USAGE,
}
CHAT_CHUNK = {
    "id": "chatcmpl-1",
    "object": "chat.completion.chunk",
    "created": 1741570283,
    "model": "smollm2-135m-instruct",
    "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"},
                 "logprobs": None, "finish_reason": None}],
}
COMPLETION = {
    "id": "cmpl-1",
    "object": "text_completion",
    "created": 1589478378,
    "model": "smollm2-135m-instruct",
    "choices": [{"text": "a test", "index": 0, "logprobs": None, "finish_reason": "length"}],
    "usage": USAGE,
}
ERROR = {"error": {"message": "max_tokens must be >= 1", "type": "invalid_request_error",
                   "param": "max_tokens", "code": None}}
MODEL = {"id": "smollm2-135m-instruct", "object": "model", "created": 1700000000,
         "owned_by": "rill"}
MODEL_LIST = {"object": "list", "data": [MODEL]}


def _without(instance: dict, *path: str | int) -> dict:
    broken = copy.deepcopy(instance)
    node = broken
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return broken


def _with(instance: dict, value, *path: str | int) -> dict:
    broken = copy.deepcopy(instance)
    node = broken
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return broken


VALID = [
    ("CreateChatCompletionResponse", CHAT_COMPLETION),
    ("CreateChatCompletionStreamResponse", CHAT_CHUNK),
    ("CreateCompletionResponse", COMPLETION),
    ("ErrorResponse", ERROR),
    ("ListModelsResponse", MODEL_LIST),
    ("Model", MODEL),
]
INVALID = [
    ("CreateChatCompletionResponse", _without(CHAT_COMPLETION, "choices", 0, "logprobs")),
    ("CreateChatCompletionResponse", _with(CHAT_COMPLETION, "chat.completion.chunk", "object")),
    ("CreateChatCompletionStreamResponse", _without(CHAT_CHUNK, "choices", 0, "finish_reason")),
    ("CreateChatCompletionStreamResponse",
     _with(CHAT_CHUNK, "done", "choices", 0, "finish_reason")),
    ("CreateCompletionResponse", _with(COMPLETION, 3, "choices", 0, "text")),
    ("ErrorResponse", _without(ERROR, "error", "param")),
    ("ListModelsResponse", _with(MODEL_LIST, [{"id": "m"}], "data")),
    ("Model", _with(MODEL, "1700000000", "created")),
]


@pytest.mark.parametrize("schema_name, instance", VALID, ids=[name for name, _ in VALID])
def test_valid_examples_pass(schema_name, instance):
    openapi.validate(schema_name, instance)


@pytest.mark.parametrize("schema_name, instance", INVALID,
                         ids=[f"{name}-{i}" for i, (name, _) in enumerate(INVALID)])
def test_invalid_examples_fail(schema_name, instance):
    with pytest.raises(jsonschema.ValidationError, match=schema_name):
        openapi.validate(schema_name, instance)


def test_stream_chunk_nullable_fields():
    # The last chunk with stream_options.include_usage: choices [] and usage set;
    # the chunks before it carry usage: null.
    chunk_schema = "CreateChatCompletionStreamResponse"
    openapi.validate(chunk_schema, {**CHAT_CHUNK, "choices": [], "usage": USAGE})
    openapi.validate(chunk_schema, {**CHAT_CHUNK, "usage": None})
    finished = _with(CHAT_CHUNK, "stop", "choices", 0, "finish_reason")
    openapi.validate(chunk_schema, _with(finished, {}, "choices", 0, "delta"))


def test_spec_quirks_the_server_must_respect():
    """Fields a vLLM-like server tends to send as null that the spec does not allow."""
    with pytest.raises(jsonschema.ValidationError, match="system_fingerprint"):
        openapi.validate("CreateChatCompletionResponse",
                         {**CHAT_COMPLETION, "system_fingerprint": None})
    with pytest.raises(jsonschema.ValidationError, match="usage"):
        openapi.validate("CreateChatCompletionResponse", {**CHAT_COMPLETION, "usage": None})
    # The message must carry refusal (null is fine), not just role and content.
    with pytest.raises(jsonschema.ValidationError, match="'refusal' is a required property"):
        openapi.validate("CreateChatCompletionResponse",
                         _without(CHAT_COMPLETION, "choices", 0, "message", "refusal"))
    # Completions share one schema for bodies and stream chunks, and there finish_reason is
    # required and not nullable: a streamed chunk before the last one cannot match it.
    with pytest.raises(jsonschema.ValidationError, match="finish_reason"):
        openapi.validate("CreateCompletionResponse",
                         _with(COMPLETION, None, "choices", 0, "finish_reason"))


def test_readable_message_names_the_path():
    with pytest.raises(jsonschema.ValidationError) as caught:
        openapi.validate("CreateChatCompletionStreamResponse",
                         {**CHAT_CHUNK, "usage": {"prompt_tokens": 1}})
    assert "$['usage']" in caught.value.message
    assert "'completion_tokens' is a required property" in caught.value.message


def test_nullable_conversion():
    converted = openapi._convert_nullable({
        "a": {"type": "string", "enum": ["x"], "nullable": True},
        "b": {"$ref": "#/components/schemas/X", "nullable": True, "description": "d"},
        "c": {"type": "integer", "nullable": False},
    })
    assert converted["a"] == {"type": ["string", "null"], "enum": ["x", None]}
    assert converted["b"] == {"anyOf": [{"$ref": "#/components/schemas/X"}, {"type": "null"}],
                              "description": "d"}
    assert converted["c"] == {"type": "integer"}
    assert "'nullable'" not in repr(openapi.load_spec())


def test_unknown_schema_name():
    with pytest.raises(KeyError, match="NoSuchSchema"):
        openapi.validate("NoSuchSchema", {})


def test_spec_path_env_override(monkeypatch, tmp_path):
    monkeypatch.setenv("RILL_OPENAPI_SPEC", str(tmp_path / "spec.yaml"))
    assert openapi.spec_path() == tmp_path / "spec.yaml"
    monkeypatch.delenv("RILL_OPENAPI_SPEC")
    assert openapi.spec_path() == openapi.DEFAULT_SPEC_PATH
