"""Ollama's API requests (`/api/chat`, `/api/generate`, `/api/embed`, `/api/show`), checked field by field and
mapped onto a chat completion request, whose checks, template, tool plan and parsers they then share.

`options` takes Ollama's sampling names; the ones that size or place the model (`num_ctx`, `num_gpu`,
`num_thread`, `mirostat`, ...) are ignored, as the server's flags decide those. `keep_alive` is ignored: the
model stays loaded. `format` is `"json"` or a JSON schema (structured outputs); `think` a bool (the chat
template's `enable_thinking`) or a level (`reasoning_effort`, as gpt-oss takes it).
"""
from __future__ import annotations

import json
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from rill.asgi.requests.bounds import (
    MAX_CONTENT_PARTS,
    MAX_MESSAGES,
    MAX_STOP,
    MAX_TOOL_CALLS,
    MAX_TOOLS,
    Name,
    StopString,
)
from rill.asgi.requests.embeddings_request import MAX_INPUTS
from rill.asgi.requests.schemas import (
    INT64_MAX,
    INT64_MIN,
    ChatCompletionRequest,
    ChatMessage,
    ContentPart,
    FunctionCall,
    ImageURL,
    Penalty,
    Tool,
    ToolCall,
)


class Options(msgspec.Struct, kw_only=True):
    num_predict: Annotated[int, Meta(ge=-2, le=INT64_MAX)] | None = None  # -1: until it stops, -2: fill the context
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_k: Annotated[int, Meta(ge=0, le=INT64_MAX)] | None = None
    top_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    min_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    repeat_penalty: Annotated[float, Meta(gt=0, le=2)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    seed: Annotated[int, Meta(ge=INT64_MIN, le=INT64_MAX)] | None = None
    stop: Annotated[list[StopString], Meta(max_length=MAX_STOP)] | None = None


class OllamaCall(msgspec.Struct):
    name: Name
    arguments: dict[str, Any] = {}


class OllamaToolCall(msgspec.Struct):
    function: OllamaCall


class OllamaMessage(msgspec.Struct, kw_only=True):
    role: Name
    content: str = ""
    thinking: str | None = None
    images: Annotated[list[str], Meta(max_length=MAX_CONTENT_PARTS)] | None = None  # base64, a vision model's
    tool_calls: Annotated[list[OllamaToolCall], Meta(max_length=MAX_TOOL_CALLS)] | None = None
    tool_name: Name | None = None


class _Common(msgspec.Struct, kw_only=True):
    model: str  # compared only (a long name is a 404)
    options: Options | None = None
    format: Any = None
    stream: bool = True  # Ollama streams unless told not to
    think: bool | Name | None = None
    keep_alive: Any = None


class OllamaChat(_Common, kw_only=True):
    messages: Annotated[list[OllamaMessage], Meta(max_length=MAX_MESSAGES)] = []
    tools: Annotated[list[Tool], Meta(max_length=MAX_TOOLS)] | None = None


class OllamaGenerate(_Common, kw_only=True):
    prompt: str = ""
    suffix: str = ""
    system: str | None = None
    template: str | None = None
    raw: bool = False
    images: Annotated[list[str], Meta(max_length=MAX_CONTENT_PARTS)] | None = None  # base64, a vision model's
    context: Any = None


class OllamaEmbed(msgspec.Struct, kw_only=True):
    model: str
    input: str | Annotated[list[str], Meta(max_length=MAX_INPUTS)] = ""
    prompt: str | None = None  # the older /api/embeddings' one text
    truncate: bool = True
    options: Any = None
    keep_alive: Any = None


class OllamaModel(msgspec.Struct, kw_only=True):
    model: str = ""
    name: str = ""  # Ollama's older name for it


chat_decoder = msgspec.json.Decoder(OllamaChat)
generate_decoder = msgspec.json.Decoder(OllamaGenerate)
embed_decoder = msgspec.json.Decoder(OllamaEmbed)
model_decoder = msgspec.json.Decoder(OllamaModel)

# Chat completion fields as Ollama names them, for the 400s of the checks they share
OLLAMA_NAMES = {"max_tokens": "options.num_predict", "temperature": "options.temperature", "top_k": "options.top_k",
                "top_p": "options.top_p", "min_p": "options.min_p", "repetition_penalty": "options.repeat_penalty",
                "presence_penalty": "options.presence_penalty", "frequency_penalty": "options.frequency_penalty",
                "seed": "options.seed", "stop": "options.stop", "response_format": "format"}


def max_tokens(req: _Common) -> int | None:
    """num_predict as a completion's max_tokens: None (until the model stops or the context is full) for -1, -2."""
    num = req.options.num_predict if req.options is not None else None
    return None if num is None or num < 0 else max(num, 1)


def chat_request(req: _Common, messages: list[ChatMessage]) -> ChatCompletionRequest:
    """The chat completion request an Ollama request runs as."""
    o = req.options or Options()
    kwargs: dict[str, Any] = {}
    if isinstance(req.think, bool):
        kwargs["chat_template_kwargs"] = {"enable_thinking": req.think}
    elif isinstance(req.think, str):
        kwargs["reasoning_effort"] = req.think
    return ChatCompletionRequest(
        model=req.model, messages=messages, stream=req.stream, temperature=o.temperature,
        top_k=o.top_k or None, top_p=o.top_p or None, min_p=o.min_p, repetition_penalty=o.repeat_penalty,
        presence_penalty=o.presence_penalty, frequency_penalty=o.frequency_penalty, seed=o.seed, stop=o.stop,
        response_format=response_format(req.format), tools=getattr(req, "tools", None), **kwargs)


def response_format(fmt: Any) -> dict[str, Any] | None:
    """Ollama's `format`: "json", a JSON schema, or nothing."""
    if fmt in (None, ""):
        return None
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    return {"type": fmt}  # refused by the structured-output check, naming `format`


def chat_messages(req: OllamaChat) -> list[ChatMessage]:
    """Ollama's messages as chat's: an assistant's calls get ids (Ollama's have none), which the tool results
    after them answer in order; `thinking` is the turn's reasoning."""
    out: list[ChatMessage] = []
    call_ids: list[str] = []
    for i, m in enumerate(req.messages):
        calls = None
        if m.tool_calls:
            calls = [ToolCall(FunctionCall(name=c.function.name, arguments=json.dumps(c.function.arguments)),
                              id=f"call_{i}_{j}") for j, c in enumerate(m.tool_calls)]
            call_ids = [c.id for c in calls]
        answered = call_ids.pop(0) if m.role == "tool" and call_ids else None
        out.append(ChatMessage(role=m.role, content=with_images(m.content, m.images), tool_calls=calls,
                               reasoning_content=m.thinking,
                               name=m.tool_name, tool_call_id=answered if m.role == "tool" else None))
    return out


def with_images(text: str, images: list[str] | None) -> str | list[ContentPart]:
    """A message's text, or with Ollama's images (base64 without a media type) chat's parts: the images first, as
    Ollama's templates place them, then the text (asgi/prompt/images.py reads the format from the bytes)."""
    if not images:
        return text
    return [*(ContentPart(type="image_url", image_url=ImageURL(url=f"data:image/png;base64,{b64}")) for b64 in images),
            ContentPart(type="text", text=text)]
