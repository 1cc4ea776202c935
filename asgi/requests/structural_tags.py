"""xgrammar structural tags: a grammar over the whole output made of parts (free text, a tag around JSON, ...).

A request may send one (`structured_outputs.structural_tag`, vLLM's field): xgrammar's own form,
`{"type": "structural_tag", "format": {...}}`, or vLLM's older one, `{"type": "structural_tag", "structures":
[{"begin", "schema", "end"}], "triggers": [...]}` (text is free until a trigger begins one of the structures,
whose JSON then follows its schema), which is rewritten here into the first.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from rill.asgi.parsers.thinking_markers import ThinkingMarkers
from rill.ipc.grammar_spec import JSON_OBJECT_SCHEMA, choice_ebnf
from rill.ipc.protocol import StructuredKind, StructuredSpec


def structural_tag(value: dict[str, Any]) -> dict[str, Any]:
    """The tag in xgrammar's form; vLLM's older `structures` and `triggers` rewritten as `triggered_tags`."""
    if "format" in value or "structures" not in value:
        return value  # xgrammar's form, or neither: xgrammar says what is wrong with it
    structures, triggers = value.get("structures"), value.get("triggers")
    if not isinstance(structures, list) or not isinstance(triggers, list):
        return value
    tags = [{"begin": s.get("begin"), "content": {"type": "json_schema", "json_schema": s.get("schema")},
             "end": s.get("end")} if isinstance(s, dict) else s for s in structures]
    return {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": triggers, "tags": tags}}


def after_reasoning(spec: StructuredSpec | None, markers: ThinkingMarkers | None,
                    encode: Callable[[str], list[int]]) -> StructuredSpec | None:
    """Think, then constrain: where the output thinks (`markers`), `spec` applies from the end of the thinking on,
    as vLLM starts its grammar at the reasoning parser's end marker. A `<think>` model's thinking is free text up
    to `</think>` (which it cannot contain); then whitespace, then what `spec` allows. Where the thinking must open
    with `<think>` (qwen3), an output that does not think (thinking off) is `spec` alone. Harmony's grammar starts
    after the final channel's header (`start_ids`, the engine's). A regex, grammar or structural tag that names
    the markers itself is left as it is: the whole output, as written."""
    if spec is None or markers is None:
        return spec
    if spec.kind in (StructuredKind.REGEX, StructuredKind.GRAMMAR, StructuredKind.STRUCTURAL_TAG) and \
            any(m and m in spec.value.replace("\\", "") for m in (markers.open, markers.closed_by, markers.answer)):
        return spec
    if markers.answer:
        return StructuredSpec(spec.kind, spec.value, start_ids=encode(markers.answer))
    then = _as_format(spec)
    thinking = {"type": "tag", "begin": markers.open, "content": {"type": "any_text"}, "end": markers.close}
    after = {"type": "sequence", "elements": [thinking, {"type": "regex", "pattern": r"[ \t\r\n]*"}, then]}
    fmt = {"type": "or", "elements": [after, then]} if markers.open else after
    return StructuredSpec(StructuredKind.STRUCTURAL_TAG, json.dumps({"type": "structural_tag", "format": fmt}))


def _as_format(spec: StructuredSpec) -> dict[str, Any]:
    """A spec as one element of a structural tag's format."""
    kind, value = spec.kind, spec.value
    if kind is StructuredKind.JSON_SCHEMA:
        return {"type": "json_schema", "json_schema": json.loads(value)}
    if kind is StructuredKind.JSON_OBJECT:
        return {"type": "json_schema", "json_schema": json.loads(JSON_OBJECT_SCHEMA)}
    if kind is StructuredKind.REGEX:
        return {"type": "regex", "pattern": value}
    if kind is StructuredKind.CHOICE:
        return {"type": "grammar", "grammar": choice_ebnf(json.loads(value))}
    if kind is StructuredKind.GRAMMAR:
        return {"type": "grammar", "grammar": value}
    return json.loads(value)["format"]  # STRUCTURAL_TAG

