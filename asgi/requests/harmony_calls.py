"""`strict` functions for GPT-OSS's harmony (the `openai` tool parser): the grammar of the whole output.

Harmony writes its reasoning, its answer and its calls as messages (asgi/parsers/tools/harmony.py), so a call is not
opened by a trigger in free text, as the other formats' are (asgi/requests/strict_calls.py): here every message is
one of these, joined by `<|start|>assistant`:

    <|channel|>analysis<|message|>...<|end|>                 the reasoning
    <|channel|>commentary<|message|>...<|end|>               a preamble to the user
    <|channel|>final<|message|>...<|return|> (or <|end|>)    the answer
    <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>

a call's header also as the chat template writes it back (` to=functions.NAME<|channel|>commentary json`), its
arguments held to NAME's schema where NAME is strict (any object where not). With parallel_tool_calls false the
output ends at its first call; GPT-OSS ends its turn there anyway (`<|call|>` is a stop token).

The markers are the model's own special tokens: where each is one token of the served tokenizer (`encode`), the
grammar holds that token (an xgrammar token format), never the same text spelled in pieces, and free text never
holds a marker. Else (a template that writes harmony as text) the markers are text. The API's check compiles the
text form (`encode` None), against its byte vocabulary.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from rill.asgi.requests.tool_choice import EMPTY_PARAMETERS, ToolPlan
from rill.ipc.protocol import StructuredKind, StructuredSpec

MARKERS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|constrain|>")
Format = dict[str, Any]


def harmony_calls(plan: ToolPlan, encode: Callable[[str], list[int]] | None = None) -> StructuredSpec:
    """The grammar of a harmony output whose calls follow the plan's tools (plan.strict: schemas held)."""
    ids = [encode(m) for m in MARKERS] if encode is not None else []
    tokens = {m: i[0] for m, i in zip(MARKERS, ids)} if ids and all(len(i) == 1 for i in ids) else {}

    def marker(m: str) -> Format:
        return {"type": "token", "token": tokens[m]} if tokens else _text(m)

    def free(ends: tuple[str, ...]) -> Format:  # a message's body: <|message|>, any text but a marker, an end
        if not tokens:
            return {"type": "tag", "begin": "<|message|>", "content": {"type": "any_text"}, "end": list(ends)}
        return _seq(marker("<|message|>"), {"type": "any_tokens", "exclude_tokens": sorted(tokens.values())},
                    _or(*(marker(e) for e in ends)))

    def channel(name: str) -> Format:
        return _seq(marker("<|channel|>"), _text(name))

    json_type = {"type": "optional", "content": _or(  # ` <|constrain|>json`, `<|constrain|>json` or ` json`
        _seq({"type": "optional", "content": _text(" ")}, marker("<|constrain|>"), _text("json")), _text(" json"))}
    calls = []
    for tool in plan.tools or []:
        function = tool["function"]
        schema = (function.get("parameters") or EMPTY_PARAMETERS) if function["name"] in plan.strict \
            else {"type": "object"}
        to = f"to=functions.{function['name']}"
        header = _or(channel(f"commentary {to}"), _seq(_text(" " + to), channel("commentary")))
        calls.append(_seq(header, json_type, marker("<|message|>"), {"type": "json_schema", "json_schema": schema},
                          marker("<|call|>")))
    messages = [_seq(channel("analysis"), free(("<|end|>",))), _seq(channel("commentary"), free(("<|end|>",))),
                _seq(channel("final"), free(("<|return|>", "<|end|>")))]
    separator = _seq(marker("<|start|>"), _text("assistant"))
    start = {"type": "optional", "content": separator}  # a template whose prompt leaves the header's start out
    if plan.max_calls == 1:  # messages, then one call or none
        fmt = _seq(start, {"type": "star", "content": _seq(_or(*messages), separator)}, _or(*messages, *calls))
    else:
        fmt = _seq(start, _or(*messages, *calls), {"type": "star", "content": _seq(separator, _or(*messages, *calls))})
    return StructuredSpec(StructuredKind.STRUCTURAL_TAG, json.dumps({"type": "structural_tag", "format": fmt}))


def _text(value: str) -> Format:
    return {"type": "const_string", "value": value}


def _seq(*elements: Format) -> Format:
    return {"type": "sequence", "elements": list(elements)} if len(elements) > 1 else elements[0]


def _or(*elements: Format) -> Format:
    return {"type": "or", "elements": list(elements)} if len(elements) > 1 else elements[0]
