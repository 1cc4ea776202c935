"""Anthropic's Messages API request (`POST /v1/messages`), checked and turned into a chat request.

Taken: `system`, `messages` (asgi/requests/messages_content.py: text, tool_use, tool_result and
thinking blocks), `max_tokens` (required), `temperature`, `top_p`, `top_k`, `stop_sequences`,
`metadata`, `stream`, and `tools`, `tool_choice`, `thinking` (asgi/requests/messages_tools.py); `output_config`:
its `effort` (a thinking budget with a reasoning parser, and the template's reasoning_effort, as chat's) and its
`format` (structured outputs: JSON that follows a schema, as the beta's `output_format` too).
A final assistant turn of text is continued, as Anthropic's "prefill": the answer takes up where it ends.
`service_tier`, `container` and `mcp_servers` are refused with a 400 naming the field.
"""
from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from rill.asgi.errors import APIError
from rill.asgi.requests.bounds import (
    MAX_CONTENT_PARTS,
    MAX_MESSAGES,
    MAX_METADATA,
    MAX_STOP,
    MAX_TOOLS,
    Name,
    StopString,
)
from rill.asgi.requests.cache_salt import CacheSalt
from rill.asgi.requests.messages_content import bad, chat_messages
from rill.asgi.requests.messages_tools import (
    AnthropicTool,
    Thinking,
    ToolChoice,
    chat_tool_choice,
    chat_tools,
    thinking_enabled,
)
from rill.asgi.requests.priority import Priority
from rill.asgi.requests.schemas import ChatCompletionRequest, chat_from

UNSUPPORTED = ("service_tier", "container", "mcp_servers")


# Anthropic's effort levels (output_config.effort), each as chat's reasoning_effort (asgi/requests/thinking.py).
EFFORTS = ("low", "medium", "high", "xhigh", "max")


class OutputConfig(msgspec.Struct, kw_only=True):
    effort: Name | None = None
    format: dict[str, Any] | None = None  # {"type": "json_schema", "schema": {...}}


class PromptFields(msgspec.Struct, kw_only=True):
    """What builds the prompt: a create request's and count_tokens' fields."""

    model: str
    messages: Annotated[list[dict[str, Any]], Meta(min_length=1, max_length=MAX_MESSAGES)]
    system: str | Annotated[list[dict[str, Any]], Meta(max_length=MAX_CONTENT_PARTS)] | None = None
    tools: Annotated[list[AnthropicTool], Meta(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None


class MessagesRequest(PromptFields, kw_only=True):
    max_tokens: Annotated[int, Meta(ge=1)]
    temperature: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Meta(ge=0)] | None = None
    stop_sequences: Annotated[list[StopString], Meta(max_length=MAX_STOP)] | None = None
    metadata: Annotated[dict[str, Any], Meta(max_length=MAX_METADATA)] | None = None
    stream: bool = False
    service_tier: Any = None
    container: Any = None
    mcp_servers: Any = None
    output_format: dict[str, Any] | None = None  # the structured-outputs beta's name of output_config.format
    cache_salt: CacheSalt | None = None  # vLLM's: a namespace of its own in the prefix cache (asgi/requests/cache_salt.py)
    priority: Priority = 0  # vLLM's, under --scheduling-policy priority (asgi/requests/priority.py)


class CountTokensRequest(PromptFields, kw_only=True):
    pass


messages_decoder = msgspec.json.Decoder(MessagesRequest)
count_tokens_decoder = msgspec.json.Decoder(CountTokensRequest)


def check_unsupported(req: PromptFields) -> None:
    for name in UNSUPPORTED:
        if getattr(req, name, None) is not None:
            raise APIError(400, f"`{name}` is not supported by this server's Messages API.", param=name,
                           code="unsupported_parameter")


def prompt_body(req: PromptFields, max_tokens: int | None = None, images: bool = False) -> dict[str, Any]:
    """Chat's fields that build the prompt and choose the tools: the same for create and
    count_tokens, so that the count is the prompt a create would build. `images`: the model takes them."""
    check_unsupported(req)
    tools = chat_tools(req.tools)
    messages = chat_messages(req.system, req.messages, images)
    body: dict[str, Any] = {"model": req.model, "messages": messages, **chat_tool_choice(req.tool_choice, tools)}
    if tools is not None:
        body["tools"] = tools
    thinking = thinking_enabled(req.thinking, req.tool_choice, max_tokens)
    if _prefilled(req, messages, thinking):
        body |= {"continue_final_message": True, "add_generation_prompt": False}
    if thinking is not None:
        # Templates that can switch thinking on and off (Qwen3's) read this; others ignore it.
        body["chat_template_kwargs"] = {"enable_thinking": thinking}
    if (effort := req.output_config.effort if req.output_config else None) is not None:
        if effort not in EFFORTS:
            raise bad("output_config.effort", f"must be one of {', '.join(EFFORTS)}; got {effort!r}.")
        body["reasoning_effort"] = effort
    return body


def output_format(req: MessagesRequest) -> tuple[dict[str, Any] | None, str]:
    """The structured output asked for, as the Responses API's text.format (the same shape), and its field's name."""
    config = req.output_config.format if req.output_config else None
    if config is not None and req.output_format is not None:
        raise bad("output_format", "and `output_config.format` are the same setting: send only output_config.format.")
    fmt, where = (config, "output_config.format") if config is not None else (req.output_format, "output_format")
    if fmt is not None and fmt.get("type") != "json_schema":
        raise bad(f"{where}.type", f"must be json_schema; got {str(fmt.get('type'))[:50]!r}.")
    return fmt, where


def _prefilled(req: PromptFields, messages: list[dict[str, Any]], thinking: bool | None) -> bool:
    """Whether the answer continues the final turn: Anthropic's prefill, a final assistant turn of text (one with a
    tool_use is a turn like the others). An empty one is left out: the answer starts afresh, as Anthropic's does."""
    final = messages[-1]
    if req.messages[-1].get("role") != "assistant" or "tool_calls" in final:
        return False
    where = f"messages[{len(req.messages) - 1}].content"
    if not final["content"]:
        messages.pop()
        return False
    if final["content"] != final["content"].rstrip():
        raise bad(where, "final assistant content cannot end with trailing whitespace.")
    if thinking:
        raise bad(where, "is a final assistant turn to continue, which thinking does not allow: with thinking "
                         "enabled the answer starts its own turn.")
    return True


def chat_request(req: MessagesRequest, images: bool = False) -> ChatCompletionRequest:
    """The chat request that builds the prompt, the tool plan and the sampling parameters."""
    if any(not s for s in req.stop_sequences or []):
        raise APIError(400, "`stop_sequences` must not hold an empty string.", param="stop_sequences")
    body = {**prompt_body(req, req.max_tokens, images), "max_completion_tokens": req.max_tokens,
            "temperature": 1.0 if req.temperature is None else req.temperature, "top_p": req.top_p,
            "top_k": req.top_k, "stop": req.stop_sequences, "priority": req.priority}
    return chat_from(body, "messages")


def count_request(req: CountTokensRequest, images: bool = False) -> ChatCompletionRequest:
    return chat_from(prompt_body(req, images=images), "messages")
