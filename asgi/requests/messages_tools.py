"""A Messages request's `tools`, `tool_choice` and `thinking`, checked and put as chat's fields.

Anthropic's tools ({name, description, input_schema}) become chat's function tools, and its
tool_choice chat's: `auto` -> auto, `any` -> required, `tool` -> the named function, `none` ->
none, so that a forced choice is enforced by the grammar engine exactly as chat's is
(asgi/requests/tool_choice.py). A 400 names the field in Anthropic's terms.
"""
from __future__ import annotations

import re
from typing import Any

import msgspec

from rill.asgi.errors import APIError
from rill.asgi.requests.bounds import Name

# Anthropic's rule for a tool's name.
NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
CHOICES = ("auto", "any", "tool", "none")
# `adaptive`: the model decides how much to think; here, as `enabled` without a budget.
THINKING = ("enabled", "disabled", "adaptive")
MIN_BUDGET_TOKENS = 1024  # Anthropic's floor for thinking.budget_tokens


class AnthropicTool(msgspec.Struct, kw_only=True):
    """A client tool; server tools (web search, bash, ...) have another `type` and are refused."""

    name: Name | None = None
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: Name | None = None
    strict: bool | None = None


class ToolChoice(msgspec.Struct, kw_only=True):
    type: Name
    name: Name | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(msgspec.Struct, kw_only=True):
    type: Name
    budget_tokens: int | None = None


def bad(field: str, message: str) -> APIError:
    return APIError(400, f"`{field}` {message}", param=field)


def chat_tools(tools: list[AnthropicTool] | None) -> list[dict[str, Any]] | None:
    """Chat's function tools for Anthropic's tools; None for none."""
    if tools is None:
        return None
    out, seen = [], set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if tool.type not in (None, "custom"):
            raise APIError(400, f"`{where}.type` {tool.type!r}: server tools are not supported by this server; "
                                "only client tools (name, description, input_schema).", param=f"{where}.type",
                           code="unsupported_parameter")
        if not isinstance(tool.name, str) or not NAME.match(tool.name):
            raise bad(f"{where}.name", "is required and must match ^[a-zA-Z0-9_-]{1,64}$.")
        if tool.name in seen:
            raise bad(f"{where}.name", f"{tool.name!r} is used by another tool; tool names must be unique.")
        seen.add(tool.name)
        if tool.input_schema is None:
            raise bad(f"{where}.input_schema", "is required (a JSON schema of type object).")
        if tool.input_schema.get("type") != "object":
            raise bad(f"{where}.input_schema", 'must be a JSON schema with "type": "object".')
        function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
        if tool.description is not None:
            function["description"] = tool.description
        if tool.strict is not None:
            function["strict"] = tool.strict
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: ToolChoice | None, tools: list[dict[str, Any]] | None) -> dict[str, Any]:
    """Chat's `tool_choice` and `parallel_tool_calls` fields (only those that are set)."""
    if choice is None:
        return {}
    if choice.type not in CHOICES:
        raise bad("tool_choice.type", f"must be one of {', '.join(CHOICES)}; got {choice.type!r}.")
    fields: dict[str, Any] = {}
    if choice.disable_parallel_tool_use:
        fields["parallel_tool_calls"] = False
    if choice.type == "none":
        return {**fields, "tool_choice": "none"}
    if not tools:
        if choice.type == "auto":
            return fields  # nothing to choose from: plain text, as with no tool_choice
        raise bad("tool_choice", f"{choice.type!r} needs `tools`.")
    if choice.type == "auto":
        return {**fields, "tool_choice": "auto"}
    if choice.type == "any":
        return {**fields, "tool_choice": "required"}
    names = [t["function"]["name"] for t in tools]
    if not isinstance(choice.name, str) or choice.name not in names:
        raise bad("tool_choice.name", f"must name one of the tools ({', '.join(names)}); got {choice.name!r}.")
    return {**fields, "tool_choice": {"type": "function", "function": {"name": choice.name}}}


def forces_tool(choice: ToolChoice | None) -> bool:
    return choice is not None and choice.type in ("any", "tool")


def thinking_enabled(thinking: Thinking | None, choice: ToolChoice | None, max_tokens: int | None) -> bool | None:
    """Whether the request asks for thinking (None: it does not say); checked as Anthropic checks it."""
    if thinking is None:
        return None
    if thinking.type not in THINKING:
        raise bad("thinking.type", f"must be one of {', '.join(THINKING)}; got {thinking.type!r}.")
    if thinking.type == "disabled":
        return False
    if thinking.type == "enabled":
        budget = thinking.budget_tokens
        if budget is None:
            raise bad("thinking.budget_tokens", 'is required with "type": "enabled".')
        if budget < MIN_BUDGET_TOKENS:
            raise bad("thinking.budget_tokens", f"must be at least {MIN_BUDGET_TOKENS}; got {budget}.")
        if max_tokens is not None and budget >= max_tokens:
            raise bad("thinking.budget_tokens", f"must be less than `max_tokens` ({max_tokens}); got {budget}.")
    if forces_tool(choice):
        raise bad("tool_choice", f"{choice.type!r} forces a tool call, which leaves no room for thinking; "
                                 'with thinking, use "auto" or "none".')
    return True
