"""Anthropic's Messages API request (`POST /v1/messages`), checked and turned into a chat request.

This first slice takes text: `system` (a string or text blocks), `messages` whose content is a
string or text blocks, `max_tokens` (required), `temperature`, `top_p`, `top_k`,
`stop_sequences`, `metadata` and `stream`. Tool use, tool results, images and `thinking` are
refused with a 400 naming the field until they are built (issue 15).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from asgi.errors import APIError
from asgi.requests.schemas import ChatCompletionRequest, chat_from

UNSUPPORTED = ("tools", "tool_choice", "thinking", "service_tier", "container", "mcp_servers")


class MessagesRequest(msgspec.Struct, kw_only=True):
    model: str
    max_tokens: Annotated[int, Meta(ge=1)]
    messages: Annotated[list[dict[str, Any]], Meta(min_length=1)]
    system: str | list[dict[str, Any]] | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Meta(ge=0)] | None = None
    stop_sequences: list[str] | None = None
    metadata: dict[str, Any] | None = None
    stream: bool = False
    tools: Any = None
    tool_choice: Any = None
    thinking: Any = None
    service_tier: Any = None
    container: Any = None
    mcp_servers: Any = None


class CountTokensRequest(msgspec.Struct, kw_only=True):
    model: str
    messages: Annotated[list[dict[str, Any]], Meta(min_length=1)]
    system: str | list[dict[str, Any]] | None = None
    tools: Any = None
    thinking: Any = None


messages_decoder = msgspec.json.Decoder(MessagesRequest)
count_tokens_decoder = msgspec.json.Decoder(CountTokensRequest)
Role = Literal["user", "assistant"]


def check_unsupported(req: MessagesRequest | CountTokensRequest) -> None:
    for name in UNSUPPORTED:
        if getattr(req, name, None) is not None:
            raise APIError(400, f"`{name}` is not supported by this server's Messages API yet.", param=name,
                           code="unsupported_parameter")


def chat_messages(req: MessagesRequest | CountTokensRequest) -> list[dict[str, str]]:
    """The system prompt and the turns as chat messages of plain text."""
    out = []
    if req.system is not None:
        out.append({"role": "system", "content": _text(req.system, "system")})
    for i, message in enumerate(req.messages):
        role = message.get("role")
        if role not in ("user", "assistant"):
            raise APIError(400, f"`messages[{i}].role` must be user or assistant.", param=f"messages[{i}].role")
        if "content" not in message:
            raise APIError(400, f"`messages[{i}].content` is required.", param=f"messages[{i}].content")
        out.append({"role": role, "content": _text(message["content"], f"messages[{i}].content")})
    return out


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(400, f"`{where}` must be a string or a list of content blocks.", param=where)
    parts = []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind != "text":
            raise APIError(400, f"`{where}[{j}].type` {kind!r} is not supported yet; only text blocks.",
                           param=f"{where}[{j}].type")
        if not isinstance(block.get("text"), str):
            raise APIError(400, f"`{where}[{j}].text` must be a string.", param=f"{where}[{j}].text")
        parts.append(block["text"])
    return "".join(parts)


def chat_request(req: MessagesRequest) -> ChatCompletionRequest:
    """The chat request that builds the prompt and the sampling parameters."""
    if any(not s for s in req.stop_sequences or []):
        raise APIError(400, "`stop_sequences` must not hold an empty string.", param="stop_sequences")
    body = {"model": req.model, "messages": chat_messages(req), "max_completion_tokens": req.max_tokens,
            "temperature": 1.0 if req.temperature is None else req.temperature, "top_p": req.top_p,
            "top_k": req.top_k, "stop": req.stop_sequences}
    return chat_from(body, "messages")
