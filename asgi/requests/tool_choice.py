"""`tools` and `tool_choice` of a chat request: checked, as the template sees them, and what they force.

As vLLM: tools with no `tool_choice` mean `auto`, which needs `--enable-auto-tool-choice` and a
`--tool-call-parser`; `none` still shows the tools to the template but parses nothing; a named
function forces its arguments' JSON schema and `required` a JSON array of calls, both through
the grammar engine (asgi/requests/structured.py), with the calls built here rather than by a parser.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from rill.asgi.errors import APIError
from rill.asgi.requests.schemas import ChatCompletionRequest, NamedToolChoice
from rill.asgi.requests.structured import json_schema_spec
from rill.ipc.protocol import StructuredSpec

EMPTY_PARAMETERS = {"type": "object", "properties": {}}


class ToolMode(enum.Enum):
    NONE = "none"  # no tool calls are parsed
    AUTO = "auto"  # the tool-call parser finds the calls the model chose to make
    REQUIRED = "required"  # the grammar forces a JSON array of one or more calls
    NAMED = "named"  # the grammar forces the arguments of one function


@dataclass
class ToolPlan:
    mode: ToolMode
    tools: list[dict[str, Any]] | None  # as HF's apply_chat_template takes them; None: no tools
    function_name: str | None = None  # NAMED: the function
    schema: dict[str, Any] | None = None  # REQUIRED and NAMED: the JSON schema of the output
    # AUTO with parallel_tool_calls false (Anthropic's disable_parallel_tool_use): calls the model
    # writes past this many are left out (REQUIRED has it in its grammar; NAMED is one call).
    max_calls: int | None = None
    # AUTO: the functions marked `strict`, whose arguments the grammar holds to their schemas once the
    # model opens a call (asgi/requests/structural_tags.py: strict_calls).
    strict: tuple[str, ...] = ()


def template_tools(req: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    """The request's function tools as the chat template gets them; 400 for other kinds."""
    if not req.tools:
        return None
    tools = []
    for i, tool in enumerate(req.tools):
        if tool.type != "function":
            raise APIError(400, f"Tools of type `{tool.type}` are not supported; only `function`.",
                           param=f"tools[{i}].type")
        if tool.function is None:
            raise APIError(400, "A function tool needs `function`.", param=f"tools[{i}].function")
        if not tool.function.name:
            raise APIError(400, "A function's `name` must not be empty.", param=f"tools[{i}].function.name")
        function: dict[str, Any] = {"name": tool.function.name}
        if tool.function.description is not None:
            function["description"] = tool.function.description
        if tool.function.parameters is not None:
            function["parameters"] = tool.function.parameters
        tools.append({"type": "function", "function": function})
    return tools


def plan_tools(req: ChatCompletionRequest, *, parser_name: str | None, auto_enabled: bool) -> ToolPlan:
    tools = template_tools(req)
    choice = req.tool_choice
    if choice is None:
        choice = "auto" if tools else "none"
    if isinstance(choice, str) and choice not in ("none", "auto", "required"):
        raise APIError(400, f"`tool_choice` must be none, auto, required or "
                            f'{{"type": "function", "function": {{"name": ...}}}}; got {choice!r}.',
                       param="tool_choice")
    if choice == "none":
        return ToolPlan(ToolMode.NONE, tools)
    if choice == "required" and req.tools is not None and not req.tools:
        return ToolPlan(ToolMode.NONE, None)  # OpenAI: required with an empty list behaves as none
    if tools is None:
        raise APIError(400, "`tool_choice` needs `tools`.", param="tool_choice")
    if choice == "auto":
        if not auto_enabled:
            raise APIError(400, '"auto" tool choice needs the server started with --enable-auto-tool-choice '
                                "and --tool-call-parser.", param="tool_choice")
        if not parser_name:  # --tool-call-parser auto, and the chat template writes calls in no known format
            raise APIError(400, '"auto" tool choice needs a tool-call parser, and the chat template shows no '
                                "tool-call format this server reads (--tool-call-parser auto).", param="tool_choice")
        strict = tuple(t.function.name for t in req.tools if t.function is not None and t.function.strict)
        return ToolPlan(ToolMode.AUTO, tools, max_calls=1 if req.parallel_tool_calls is False else None, strict=strict)
    if choice == "required":
        return ToolPlan(ToolMode.REQUIRED, tools, schema=required_schema(tools, req.parallel_tool_calls))
    return _named(choice, tools)


def _named(choice: NamedToolChoice, tools: list[dict[str, Any]]) -> ToolPlan:
    if choice.type != "function":
        raise APIError(400, f"`tool_choice` of type `{choice.type}` is not supported; only `function`.",
                       param="tool_choice.type")
    by_name = {t["function"]["name"]: t["function"] for t in tools}
    function = by_name.get(choice.function.name)
    if function is None:
        raise APIError(400, f"`tool_choice` names the function `{choice.function.name}`, which is not "
                            f"in `tools`.", param="tool_choice")
    return ToolPlan(ToolMode.NAMED, tools, function_name=function["name"],
                    schema=function.get("parameters") or EMPTY_PARAMETERS)


def required_schema(tools: list[dict[str, Any]], parallel_tool_calls: bool | None) -> dict[str, Any]:
    """vLLM's schema for `required`: [{"name": one tool, "parameters": that tool's schema}, ...]."""
    return calls_schema(tools, max_calls=1 if parallel_tool_calls is False else None)


def calls_schema(tools: list[dict[str, Any]], *, max_calls: int | None, key: str = "parameters",
                 strict: tuple[str, ...] | None = None) -> dict[str, Any]:
    """A JSON array of one or more calls, each {"name": one tool, `key`: that tool's schema} (any object for a
    tool not in `strict`, where given); the tools' `$defs` are lifted to the top, where their `$ref`s point."""
    defs: dict[str, Any] = {}
    choices = []
    for tool in tools:
        function = tool["function"]
        if strict is not None and function["name"] not in strict:
            parameters: dict[str, Any] = {"type": "object"}
        else:
            parameters = dict(function.get("parameters") or EMPTY_PARAMETERS)
        tool_defs = parameters.pop("$defs", None) if isinstance(parameters.get("$defs"), dict) else {}
        for name, schema in tool_defs.items():
            if defs.get(name, schema) != schema:
                raise APIError(400, f"Two tools define `$defs.{name}` differently; a grammar over all their calls "
                                    "needs one definition.", param="tools")
            defs[name] = schema
        choices.append({"properties": {"name": {"type": "string", "enum": [function["name"]]}, key: parameters},
                        "required": ["name", key]})
    schema: dict[str, Any] = {"type": "array", "minItems": 1,
                              "items": {"type": "object", "anyOf": choices}}
    if max_calls is not None:
        schema["maxItems"] = max_calls
    if defs:
        schema["$defs"] = defs
    return schema


def forced_spec(plan: ToolPlan, existing: StructuredSpec | None) -> StructuredSpec | None:
    """The grammar that forces `required` or a named function (None for none and auto); a
    request may not force a tool call and another structured output at once."""
    if plan.schema is None:
        return existing
    if existing is not None:
        raise APIError(400, f"`tool_choice` {plan.mode.value} forces a tool call's JSON; it cannot be combined "
                            "with response_format or another structured output.", param="tool_choice")
    return json_schema_spec(plan.schema, param="tools")
