"""`strict` functions under `tool_choice: auto`: the grammar holds a call's arguments to its function's schema
once the model has opened the call, the text around calls free (an xgrammar structural tag's triggered tags)."""
from __future__ import annotations

import json
from collections.abc import Callable

from rill.asgi.parsers.thinking_markers import HARMONY_PARSER
from rill.asgi.parsers.tools import TOOL_PARSERS
from rill.asgi.requests.harmony_calls import harmony_calls
from rill.asgi.requests.tool_choice import EMPTY_PARAMETERS, ToolMode, ToolPlan, calls_schema
from rill.ipc.protocol import StructuredKind, StructuredSpec


def strict_calls(plan: ToolPlan, tool_parser: str | None,
                 encode: Callable[[str], list[int]] | None = None) -> StructuredSpec | None:
    """With `tool_choice: auto` and functions marked `strict`: free text, until the model opens a call (the
    parser's trigger); then the call is one of the tools', written the parser's way, its arguments (JSON, or the
    XML formats' parameters: qwen3_coder's and seed_oss's, glm45's, minimax_m2's; after kimi_k2's index) held to
    the function's schema where it is strict (any object where not); granite's, phi4_mini_json's and
    hunyuan_a13b's an array of calls. With parallel_tool_calls false, the output ends at the first call.
    Harmony's (`openai`) is the whole output's grammar instead, its markers the model's tokens where `encode`
    finds each one token (asgi/requests/harmony_calls.py). None where no function is strict, or the parser's
    format is Python's calls (pythonic, olmo3)."""
    if plan.mode is not ToolMode.AUTO or not plan.strict:
        return None
    if tool_parser == HARMONY_PARSER:
        return harmony_calls(plan, encode)
    parser = TOOL_PARSERS.get(tool_parser) if tool_parser else None
    if (arrays := getattr(parser, "call_arrays", None)) is not None:
        return _array_calls(plan, arrays)
    if (call_tag := getattr(parser, "call_tag", None)) is None:
        return None
    trigger, begin, end = call_tag
    style = getattr(parser, "call_style", "json")  # the XML formats' parameters: xgrammar's style of each
    tags = []
    for tool in plan.tools or []:
        function = tool["function"]
        schema = (function.get("parameters") or EMPTY_PARAMETERS) if function["name"] in plan.strict \
            else {"type": "object"}
        content = {"type": "json_schema", "json_schema": schema, "style": style}
        if (index_end := getattr(parser, "call_index", None)) is not None:  # Kimi's: the model's index, then this
            content = {"type": "sequence", "elements": [{"type": "regex", "pattern": "[0-9]{1,9}"},
                                                        {"type": "const_string", "value": index_end}, content]}
        tags.append({"begin": begin.replace("NAME", json.dumps(function["name"])[1:-1]), "content": content,
                     "end": end})
    if (block := getattr(parser, "call_block", None)) is not None:  # MiniMax's: the calls one after another in a block
        calls = {"type": "tags_with_separator", "tags": tags, "separator": "", "at_least_one": True,
                 "stop_after_first": plan.max_calls == 1}
        tags = [{"begin": block[0], "content": calls, "end": block[1]}]
    fmt = {"type": "triggered_tags", "triggers": [trigger], "tags": tags, "stop_after_first": plan.max_calls == 1}
    return StructuredSpec(StructuredKind.STRUCTURAL_TAG, json.dumps({"type": "structural_tag", "format": fmt}))


def _array_calls(plan: ToolPlan, arrays: tuple[tuple[str, str], ...]) -> StructuredSpec:
    """Granite's, Phi-4-mini's and Hunyuan's: from a marker (`begin`) on, a JSON array of calls
    [{"name": ..., "arguments": {...}}, ...] (one with parallel_tool_calls false), then `end`."""
    schema = calls_schema(plan.tools or [], max_calls=plan.max_calls, key="arguments", strict=plan.strict)
    tags = [{"begin": begin, "content": {"type": "json_schema", "json_schema": schema}, "end": end}
            for begin, end in arrays]
    fmt = {"type": "triggered_tags", "triggers": [begin for begin, _ in arrays], "tags": tags,
           "stop_after_first": plan.max_calls == 1}
    return StructuredSpec(StructuredKind.STRUCTURAL_TAG, json.dumps({"type": "structural_tag", "format": fmt}))
