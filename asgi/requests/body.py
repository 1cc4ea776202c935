"""Every JSON request body is decoded here: UTF-8, nesting depth and msgspec's typed validation,
each failure an OpenAI 400 (naming the parameter where msgspec names one, or the free-form field
that nests too deep)."""
from __future__ import annotations

from typing import TypeVar

import msgspec

from rill.asgi.errors import APIError, from_validation_error
from rill.asgi.requests.nesting import MAX_DEPTH, deep_field

T = TypeVar("T")


def has_key(body: bytes, key: str) -> bool:
    """Whether the body is a JSON object with this top-level key (one route's two forms, told apart)."""
    try:
        keys = msgspec.json.decode(body, type=dict[str, msgspec.Raw])
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return False  # decode_json with the other form's decoder reports what is wrong with the body
    return key in keys


def has_messages(body: bytes) -> bool:
    """Whether the body has a top-level `messages` key (the chat form of vLLM's /tokenize and /classify)."""
    return has_key(body, "messages")


def decode_json(decoder: msgspec.json.Decoder[T], body: bytes) -> T:
    try:
        # JSON is UTF-8 (RFC 8259). msgspec checks it only in the strings it decodes: in an
        # object key it does not, so `"max_t\xffokens": 4` was an unknown key, silently skipped.
        body.decode()
    except UnicodeDecodeError:
        raise APIError(400, "The request body is not valid JSON: it is not valid UTF-8.",
                       code="invalid_json") from None
    try:
        req = decoder.decode(body)
    except msgspec.DecodeError as exc:
        raise from_validation_error(exc) from None
    except RecursionError:  # raised outside DecodeError; unknown fields are skipped recursively too
        raise APIError(400, "The request body is not valid JSON: it is nested too deeply.",
                       code="invalid_json") from None
    if isinstance(req, msgspec.Struct) and (field := deep_field(req)) is not None:
        raise APIError(400, f"`{field}` nests deeper than {MAX_DEPTH} levels of arrays and objects.",
                       param=field, code="invalid_value")
    return req
