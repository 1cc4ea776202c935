"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API over chat's machinery.

Errors on these paths (the app's too: a 401, a 413) take Anthropic's shape, `anthropic_error`:
{"type": "error", "error": {"type": "invalid_request_error", "message": ...}}, with the status
the OpenAI-style error has.
"""
from __future__ import annotations

import uuid

import msgspec

from rill.asgi.engine_link.generate import Generation
from rill.asgi.http.access_log import log_request_content
from rill.asgi.http.primitives import send_response
from rill.asgi.http.router import HTTPRequest
from rill.asgi.output.messages_blocks import MessageBlocks
from rill.asgi.output.messages_format import MessageStream, error_event
from rill.asgi.output.respond import respond
from rill.asgi.prompt.chat_messages import render_messages
from rill.asgi.requests.body import decode_json
from rill.asgi.requests.generation_plan import plan_generation
from rill.asgi.requests.messages_request import (
    chat_request,
    count_request,
    count_tokens_decoder,
    messages_decoder,
    output_format,
)
from rill.asgi.requests.model_choice import resolve_model
from rill.asgi.state import WorkerState

# Anthropic's error types by HTTP status.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


PREFIX = "/v1/messages"


def anthropic_error(status: int, message: str) -> bytes:
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return msgspec.json.encode(error_event(message, kind))


async def create_message(http: HTTPRequest) -> None:
    """As the chat route: the tool plan (a forced tool_choice becomes the grammar) and the output
    parsers (reasoning, tool calls) are chat's; only the answer's shape is Anthropic's."""
    state: WorkerState = http.state
    settings = state.settings
    req = decode_json(messages_decoder, http.body)
    lora = await resolve_model(state, req.model)  # the served model or a LoRA adapter
    log_request_content(settings.http.log_requests, req)
    chat = chat_request(req, images=state.vision is not None)
    fmt, fmt_param = output_format(req)
    # Anthropic's budget_tokens, enforced with a reasoning parser (asgi/requests/thinking.py); else the budget of
    # output_config.effort, as chat's reasoning_effort
    budget = {"thinking_tokens": req.thinking.budget_tokens} if req.thinking is not None and \
        req.thinking.type == "enabled" else {}
    plan = await plan_generation(state, chat, max_tokens=req.max_tokens, stop=req.stop_sequences, lora=lora,
                                 text_format=fmt, text_format_param=fmt_param, **budget)
    message_id = f"msg_{uuid.uuid4().hex}"
    gen = Generation(state.client, message_id, [plan.prompt_ids], plan.params, plan.make_detok,
                     cache_salt=req.cache_salt)
    shape = MessageStream(message_id, req.model, MessageBlocks(plan.make_parser()))
    await respond(gen, shape, stream=req.stream, receive=http.receive, send=http.send,
                  keepalive_s=settings.http.sse_keepalive_s)


async def count_tokens(http: HTTPRequest) -> None:
    """The prompt create would build from the same system, messages, tools and thinking."""
    state: WorkerState = http.state
    req = decode_json(count_tokens_decoder, http.body)
    await resolve_model(state, req.model)
    prompt_ids = await render_messages(state, count_request(req, images=state.vision is not None))
    await send_response(http.send, 200, msgspec.json.encode({"input_tokens": len(prompt_ids)}))
