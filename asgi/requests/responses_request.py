"""The body of POST /v1/responses, decoded by msgspec at the edge, and what it may not ask for."""
from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from rill.asgi.errors import APIError, unsupported
from rill.asgi.requests.bounds import MAX_MESSAGES, MAX_METADATA, MAX_SMALL_LIST, MAX_TOOLS, LogprobsCount, Name
from rill.asgi.requests.cache_salt import CacheSalt
from rill.asgi.requests.priority import Priority
from rill.asgi.requests.schemas import PositiveInt, Temperature, TopP

MAX_METADATA_ENTRIES, MAX_METADATA_KEY_LEN, MAX_METADATA_VALUE_LEN = MAX_METADATA, 64, 512


class ResponseTool(msgspec.Struct, kw_only=True):
    """Responses' function tool is flat: {type, name, description, parameters, strict}."""

    type: Name
    name: Name | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TextParam(msgspec.Struct, kw_only=True):
    format: dict[str, Any] | None = None
    verbosity: Name | None = None


class ResponsesRequest(msgspec.Struct, kw_only=True):
    model: str
    input: str | Annotated[list[dict[str, Any]], Meta(max_length=MAX_MESSAGES)] | None = None
    instructions: str | None = None
    tools: Annotated[list[ResponseTool], Meta(max_length=MAX_TOOLS)] | None = None
    tool_choice: Name | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextParam | None = None
    max_output_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_logprobs: LogprobsCount | None = None
    include: Annotated[list[Name], Meta(max_length=MAX_SMALL_LIST)] | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = True
    stream: bool | None = False
    user: Name | None = None
    safety_identifier: Name | None = None
    prompt_cache_key: Name | None = None
    truncation: Name | None = None
    background: bool | None = None
    reasoning: dict[str, Any] | None = None
    previous_response_id: Name | None = None
    conversation: Any = None
    prompt: Any = None
    max_tool_calls: Any = None
    service_tier: Name | None = None
    stream_options: Any = None
    cache_salt: CacheSalt | None = None  # vLLM's: a namespace of its own in the prefix cache (asgi/requests/cache_salt.py)
    priority: Priority = 0  # vLLM's (asgi/requests/priority.py)


responses_decoder = msgspec.json.Decoder(ResponsesRequest)
LOGPROBS_INCLUDE = "message.output_text.logprobs"
REASONING_INCLUDE = "reasoning.encrypted_content"  # asgi/requests/reasoning_blob.py


def check_request(req: ResponsesRequest) -> None:
    """400s naming the parameter for what this server refuses."""
    if req.background and req.store is False:
        raise APIError(400, "A `background` response must be stored: `store` cannot be false.", param="background")
    if req.conversation is not None and req.previous_response_id is not None:
        raise APIError(400, "`conversation` and `previous_response_id` cannot both be set.", param="conversation")
    if req.prompt is not None:
        raise unsupported("prompt")
    if req.truncation not in (None, "disabled", "auto"):
        raise APIError(400, "`truncation` must be auto or disabled.", param="truncation")
    if req.input is None and req.previous_response_id is None and req.conversation is None:
        raise APIError(400, "`input` is required.", param="input")
    check_metadata(req.metadata)
    for i, tool in enumerate(req.tools or []):
        if tool.type != "function":
            raise APIError(400, f"Tools of type `{tool.type}` are not supported; only `function`.",
                           param=f"tools[{i}].type", code="unsupported_parameter")
        if not tool.name:
            raise APIError(400, "A function tool needs a `name`.", param=f"tools[{i}].name")
    for i, what in enumerate(req.include or []):
        if what not in (LOGPROBS_INCLUDE, REASONING_INCLUDE):
            raise APIError(400, f"`include` value `{what}` is not supported; only `{LOGPROBS_INCLUDE}` and "
                                f"`{REASONING_INCLUDE}`.", param=f"include[{i}]", code="unsupported_parameter")


def check_metadata(metadata: dict[str, str] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > MAX_METADATA_ENTRIES:
        raise APIError(400, f"`metadata` may hold at most {MAX_METADATA_ENTRIES} entries; it has {len(metadata)}.",
                       param="metadata")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY_LEN:
            raise APIError(400, f"`metadata` keys may be at most {MAX_METADATA_KEY_LEN} characters.",
                           param="metadata")
        if len(value) > MAX_METADATA_VALUE_LEN:
            raise APIError(400, f"`metadata` values may be at most {MAX_METADATA_VALUE_LEN} characters "
                                f"(the value of `{key[:64]}`).", param="metadata")


def wants_logprobs(req: ResponsesRequest) -> bool:
    return LOGPROBS_INCLUDE in (req.include or [])


def wants_sealed_reasoning(req: ResponsesRequest) -> bool:
    return REASONING_INCLUDE in (req.include or [])
