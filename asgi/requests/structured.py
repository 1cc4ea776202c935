"""Structured outputs at the edge: a request's constraint as one StructuredSpec, checked to compile (else a 400).

Accepted, at most one per request: OpenAI's `response_format` (`text`, `json_object`,
`json_schema`), vLLM's `structured_outputs` (`json`, `regex`, `choice`, `grammar`,
`json_object`), and vLLM's older `guided_json`, `guided_regex`, `guided_choice`,
`guided_grammar`. The engine compiles the spec against the tokenizer and masks each step's
logits with it (engine_proc/grammar_*.py).
"""
from __future__ import annotations

import asyncio
import functools
import importlib
from typing import Any

import msgspec

from rill.asgi.errors import APIError
from rill.asgi.requests import nesting
from rill.asgi.requests.bounds import MAX_CONSTRAINT_LEN
from rill.asgi.requests.schemas import SamplingFields
from rill.asgi.requests.structural_tags import structural_tag
from rill.ipc.protocol import StructuredKind, StructuredSpec

_GUIDED = (("guided_json", StructuredKind.JSON_SCHEMA), ("guided_regex", StructuredKind.REGEX),
           ("guided_choice", StructuredKind.CHOICE), ("guided_grammar", StructuredKind.GRAMMAR))
# vLLM's StructuredOutputsParams: its constraints (exactly one is set) and, ignored here, its options.
_STRUCTURED_OUTPUTS = {"json": StructuredKind.JSON_SCHEMA, "regex": StructuredKind.REGEX,
                       "choice": StructuredKind.CHOICE, "grammar": StructuredKind.GRAMMAR,
                       "json_object": StructuredKind.JSON_OBJECT, "structural_tag": StructuredKind.STRUCTURAL_TAG}
_RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema")
_WHAT = {StructuredKind.JSON_SCHEMA: "JSON schema", StructuredKind.STRUCTURAL_TAG: "structural tag"}


CONSTRAINT_FIELDS = ("response_format", "structured_outputs", *(param for param, _ in _GUIDED))
_checker_loaded = False


async def load_checker(req: SamplingFields, constrained: bool = False, *, forced_schema: dict[str, Any] | None = None,
                       text_format: dict[str, Any] | None = None, strict: StructuredSpec | None = None,
                       text_format_param: str = "text.format") -> None:
    """Imports xgrammar the first time a request may need it, on a thread: it imports torch (about
    2 s here), which on the event loop would stall every stream of this worker. `constrained`: the
    caller knows of a constraint `req` does not hold (the Responses API's `text.format`).

    Then compiles the request's constraints on a thread too (a 400 if one is bad): xgrammar
    releases the GIL, and a schema at MAX_CONSTRAINT_LEN can take a second. The checks that build
    the request's spec later find the result in their cache. `forced_schema`: a tool plan's
    (required or named); `text_format`: the Responses API's (or the Messages API's output format, its errors naming
    `text_format_param`); `strict`: the grammar of strict tools' calls
    (asgi/requests/strict_calls.py), bounded and compiled like the rest, its errors naming `tools`."""
    global _checker_loaded
    if text_format is not None and text_format.get("type") == "text":
        text_format = None  # plain text: nothing to compile
    constrained = constrained or forced_schema is not None or text_format is not None or strict is not None or \
        any(getattr(req, f) is not None for f in CONSTRAINT_FIELDS) or \
        getattr(req, "tool_choice", None) not in (None, "none", "auto")  # required or named: forced
    if not constrained:
        return
    if not _checker_loaded:
        await asyncio.to_thread(importlib.import_module, "rill.ipc.grammar_spec")
        _checker_loaded = True
    await asyncio.to_thread(_check_all, req, forced_schema, text_format, strict, text_format_param)


def _check_all(req: SamplingFields, forced_schema: dict[str, Any] | None, text_format: dict[str, Any] | None,
               strict: StructuredSpec | None, text_format_param: str) -> None:
    structured_spec(req)
    if forced_schema is not None:
        json_schema_spec(forced_schema)
    if text_format is not None:
        text_format_spec(text_format, text_format_param)
    if strict is not None:
        checked(strict, "tools")


def structured_spec(req: SamplingFields) -> StructuredSpec | None:
    """The request's one constraint, compiled once to check it; None if it has none."""
    # (the request's field, its spec, the parameter that holds the constraint's value)
    found: list[tuple[str, StructuredSpec, str]] = []
    if (got := _response_format(req.response_format)) is not None:
        found.append(("response_format", *got))
    if req.structured_outputs is not None:
        found.append(("structured_outputs", *_structured_outputs(req.structured_outputs)))
    for param, kind in _GUIDED:
        if (value := getattr(req, param)) is not None:
            found.append((param, _spec(kind, value, param), param))
    if not found:
        return None
    if len(found) > 1:
        names = " and ".join(f"`{field}`" for field, _, _ in found)
        raise APIError(400, f"A request takes one structured output constraint; it has {names}.",
                       param=found[1][0], code="invalid_value")
    _, spec, param = found[0]
    return checked(spec, param)


def json_schema_spec(schema: dict[str, Any], param: str = "tools") -> StructuredSpec:
    """A spec forcing JSON valid against `schema` (tool calls use it); a 400 naming `param` if it cannot compile."""
    return checked(_spec(StructuredKind.JSON_SCHEMA, schema, param), param)


def checked(spec: StructuredSpec, param: str) -> StructuredSpec:
    """`spec` if it is at most MAX_CONSTRAINT_LEN long and xgrammar can build its grammar; else a 400
    naming `param`."""
    if len(spec.value) > MAX_CONSTRAINT_LEN:
        raise APIError(400, f"`{param}` is too large a constraint: {len(spec.value)} characters as JSON text; "
                            f"at most {MAX_CONSTRAINT_LEN}.", param=param, code="invalid_value")
    if (error := _grammar_error(spec.kind, spec.value)) is not None:
        raise APIError(400, f"`{param}` is not a valid constraint: {error}", param=param, code="invalid_value")
    return spec


def _build_error(kind: StructuredKind, value: str) -> str | None:
    """Why xgrammar cannot build the grammar, or why it admits no output (about a millisecond), or None."""
    from rill.ipc.grammar_spec import GrammarError, check_spec  # imports xgrammar on first use

    try:
        check_spec(StructuredSpec(kind, value))
    except GrammarError as exc:
        return str(exc)
    return None


# Keyed by the spec: a client that sends one schema again and again pays once (256 specs of at
# most MAX_CONSTRAINT_LEN: 16 MiB at most).
_grammar_error = functools.lru_cache(maxsize=256)(_build_error)


def _response_format(rf: Any) -> tuple[StructuredSpec, str] | None:
    if rf is None:
        return None
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise _bad("response_format", "must be an object with a string `type`")
    kind = rf["type"]
    if kind not in _RESPONSE_FORMAT_TYPES:
        raise _bad("response_format.type", f"must be one of {', '.join(_RESPONSE_FORMAT_TYPES)}; got {kind[:50]!r}")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredSpec(StructuredKind.JSON_OBJECT, ""), "response_format"
    js = rf.get("json_schema")
    if not isinstance(js, dict):
        raise _bad("response_format.json_schema", "must be an object when `type` is json_schema")
    return _json_schema_format(js, "response_format.json_schema", name_required=True)


def text_format_spec(fmt: dict[str, Any], where: str = "text.format") -> StructuredSpec | None:
    """The Responses API's `text.format` (its json_schema fields flat, beside `type`; Anthropic's output format has the
    same shape), checked to compile, with errors naming `where...`; None for plain text."""
    kind = fmt.get("type")
    if kind not in _RESPONSE_FORMAT_TYPES:
        raise _bad(f"{where}.type", f"must be one of {', '.join(_RESPONSE_FORMAT_TYPES)}; got {str(kind)[:50]!r}")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredSpec(StructuredKind.JSON_OBJECT, "")
    return checked(*_json_schema_format(fmt, where, name_required=False))


def _json_schema_format(js: dict[str, Any], where: str, *, name_required: bool) -> tuple[StructuredSpec, str]:
    """A json_schema format's fields (`name`, `description`, `strict`, `schema`) checked, with
    errors naming `where.<field>`; strict or not, the output follows the schema (a grammar cannot
    half-follow it)."""
    for key, types in (("name", str), ("description", str), ("strict", bool)):
        if (js.get(key) is not None or (key == "name" and name_required)) and not isinstance(js.get(key), types):
            raise _bad(f"{where}.{key}", f"must be a {types.__name__}")
    if "schema" not in js:
        raise _bad(f"{where}.schema", "is required: the JSON schema the output must follow")
    param = f"{where}.schema"
    return _spec(StructuredKind.JSON_SCHEMA, js["schema"], param), param


def _structured_outputs(so: Any) -> tuple[StructuredSpec, str]:
    if not isinstance(so, dict):
        raise _bad("structured_outputs", "must be an object")
    keys = [k for k in _STRUCTURED_OUTPUTS if so.get(k) is not None and so.get(k) is not False]
    if len(keys) != 1:
        raise _bad("structured_outputs", f"must set exactly one of {', '.join(_STRUCTURED_OUTPUTS)}")
    key = keys[0]
    param = f"structured_outputs.{key}"
    kind = _STRUCTURED_OUTPUTS[key]
    if kind is StructuredKind.JSON_OBJECT:
        if so[key] is not True:
            raise _bad(param, "must be a boolean")
        return StructuredSpec(kind, ""), param
    return _spec(kind, so[key], param), param


def _spec(kind: StructuredKind, value: Any, param: str) -> StructuredSpec:
    """The spec of one constraint's value, its type checked; whether it compiles is `checked`'s job."""
    if kind in (StructuredKind.JSON_SCHEMA, StructuredKind.STRUCTURAL_TAG):
        if isinstance(value, str):  # vLLM also takes the schema (and the tag) as JSON text
            try:
                value = nesting.loads(value)
            except nesting.TooDeep as exc:
                raise _bad(param, f"is not a valid constraint: {exc}") from None
            except ValueError:
                raise _bad(param, f"must be a {_WHAT[kind]} (an object, or its JSON text)") from None
        if not isinstance(value, dict):
            raise _bad(param, f"must be a {_WHAT[kind]} (an object)")
        if kind is StructuredKind.STRUCTURAL_TAG:
            value = structural_tag(value)
        return StructuredSpec(kind, msgspec.json.encode(value).decode())
    if kind is StructuredKind.CHOICE:
        if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
            raise _bad(param, "must be a non-empty list of strings")
        return StructuredSpec(kind, msgspec.json.encode(value).decode())
    if not isinstance(value, str) or not value:  # REGEX, GRAMMAR
        raise _bad(param, "must be a non-empty string")
    return StructuredSpec(kind, value)


def _bad(param: str, what: str) -> APIError:
    return APIError(400, f"`{param}` {what}.", param=param, code="invalid_value")
