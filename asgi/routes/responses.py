"""POST /v1/responses (OpenAI's Responses API) through the chat path, streamed as typed events or one body."""
from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from rill.asgi.engine_link.generate import Generation, Usage, new_request_id
from rill.asgi.errors import APIError
from rill.asgi.http.access_log import log_request_content
from rill.asgi.http.primitives import send_response
from rill.asgi.http.router import HTTPRequest
from rill.asgi.output.event_log import EventLog, Recorded, send_events
from rill.asgi.output.logprobs_format import ChatLogprobs
from rill.asgi.output.respond import respond
from rill.asgi.output.responses_format import ResponseBuilder, ResponseStream
from rill.asgi.prompt.chat_messages import render_chat
from rill.asgi.prompt.oldest_dropped import fitting
from rill.asgi.requests.body import decode_json
from rill.asgi.requests.generation_plan import plan_generation
from rill.asgi.requests.model_choice import resolve_model
from rill.asgi.requests.responses_input import chat_request, input_items, items_to_messages
from rill.asgi.requests.responses_request import (
    ResponsesRequest,
    check_request,
    responses_decoder,
    wants_logprobs,
    wants_sealed_reasoning,
)
from rill.asgi.routes.conversations import append_items, conversation_id_of, items_or_404
from rill.asgi.state import WorkerState
from rill.asgi.stores.base import StoredResponse, StoreUnavailable


def decode(body: bytes) -> ResponsesRequest:
    req = decode_json(responses_decoder, body)
    check_request(req)
    return req


async def stored_or_404(state: WorkerState, response_id: str, param: str | None = None) -> StoredResponse:
    entry = await state.store.get_response(response_id) if state.store.responses.enabled else None
    if entry is None:
        why = "the response store is disabled on this server" if not state.store.responses.enabled else \
            "it was never stored (store: false), was deleted, expired or was evicted"
        raise APIError(404, f"No response with id `{response_id}` found: {why}.", param=param, code="not_found")
    return entry


async def prepare(state: WorkerState, req: ResponsesRequest):
    """(input items, chat messages of the chain, the chat request, (prompt ids, its images))."""
    history: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        history = (await stored_or_404(state, req.previous_response_id, "previous_response_id")).messages
    images = state.vision is not None
    if (conversation_id := conversation_id_of(req.conversation)) is not None:
        history = items_to_messages(await items_or_404(state, conversation_id, "conversation"), "conversation",
                                    images)
    items = input_items(req)
    messages = [*history, *items_to_messages(items, images=images)]
    if req.truncation == "auto":  # the oldest items dropped until the prompt fits (asgi/prompt/oldest_dropped.py)
        limit = state.settings.limits.max_model_len - (req.max_output_tokens or 1)
        messages, prompt = await fitting(messages, lambda kept: render_chat(state, chat_request(req, kept)),
                                         lambda ids: len(ids) <= limit)
        return items, messages, chat_request(req, messages), prompt
    chat = chat_request(req, messages)
    prompt = await render_chat(state, chat)
    return items, messages, chat, prompt


def echoed_fields(req: ResponsesRequest, response_id: str, state: WorkerState,
                  effort: str | None) -> dict[str, Any]:
    """What a Response repeats of its request (the defaults it ran with where the request left one out; the
    reasoning effort it honoured, GenerationPlan.effort)."""
    tools = [{"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters,
              "strict": t.strict} for t in req.tools or []]
    return {"id": response_id, "model": req.model, "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens, "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": effort, "summary": summary if (summary := (req.reasoning or {}).get("summary")) in
                          ("auto", "concise", "detailed") else None}, "store": req.store is not False,
            # where the request left them out, the model's defaults (asgi/requests/sampling_defaults.py)
            "temperature": state.sampling_defaults.get("temperature", 1.0) if req.temperature is None else req.temperature,
            "top_p": state.sampling_defaults.get("top_p", 1.0) if req.top_p is None else req.top_p,
            "top_logprobs": req.top_logprobs,
            "text": {"format": (req.text.format if req.text and req.text.format else {"type": "text"})},
            "tool_choice": req.tool_choice if req.tool_choice is not None else "auto", "tools": tools,
            "truncation": req.truncation or "disabled", "metadata": req.metadata or {}, "background": bool(req.background), "service_tier": "default",
            "conversation": {"id": cid} if (cid := conversation_id_of(req.conversation)) else None,
            "moderation": None,
            # Required by the spec, whose only ttl value is 30m; this server's prefix cache is implicit.
            "prompt_cache_options": {"ttl": "30m", "mode": "implicit"},
            **{k: v for k, v in (("user", req.user), ("safety_identifier", req.safety_identifier)) if v is not None}}


async def create_response(http: HTTPRequest) -> None:
    state: WorkerState = http.state
    req = decode(http.body)
    lora = await resolve_model(state, req.model)  # the served model or a LoRA adapter
    log_request_content(state.settings.http.log_requests, req)
    settings = state.settings
    items, messages, chat, (prompt_ids, images) = await prepare(state, req)
    num_top = chat.top_logprobs if chat.logprobs else None
    plan = await plan_generation(state, chat, max_tokens=req.max_output_tokens, prompt_ids=prompt_ids, images=images,
                                 prompt_param="input", max_tokens_param="max_output_tokens",
                                 text_format=req.text.format if req.text is not None else None, logprobs=num_top,
                                 lora=lora)
    params = plan.params
    response_id = new_request_id("resp").replace("-", "_")
    gen = Generation(state.client, response_id, [prompt_ids], params, plan.make_detok, cache_salt=req.cache_salt)
    logprobs = ChatLogprobs(state.token_texts, num_top) if wants_logprobs(req) and num_top is not None else None
    builder = ResponseBuilder(echoed_fields(req, response_id, state, plan.effort), plan.make_parser(), logprobs,
                              sealed_reasoning=wants_sealed_reasoning(req))
    builder.usage = Usage(prompt_tokens=len(prompt_ids))  # the spec requires usage, even in progress
    gen.on_cancel = lambda: _cancel(gen, builder)  # a cancel from another API worker, through the engine
    entry = None
    if req.background and not state.store.responses.enabled:
        raise APIError(400, "A `background` response must be stored, and this server's response store is disabled.",
                       param="background")
    if req.background and len(state.background) >= settings.limits.max_num_seqs:  # no connection holds them
        raise APIError(429, f"This worker runs at most {settings.limits.max_num_seqs} background responses at once "
                            "(--max-num-seqs); retry once one has ended.", type="requests", param="background",
                       code="rate_limit_exceeded", headers=[(b"retry-after", b"1")])
    # A background stream's events are kept (asgi/output/event_log.py): its client may leave and come back.
    events = EventLog(state.store, response_id) if req.background and req.stream else None
    if req.store is not False and state.store.responses.enabled:
        entry = StoredResponse(id=response_id, response=builder.response(), input_items=items, messages=messages,
                               events=None if events is None else 0)
        await state.store.put_response(entry)  # acknowledged only once stored: a GET anywhere finds it
        state.in_progress[response_id] = gen.on_cancel
    finished = False

    async def before_last(failed: bool) -> None:
        nonlocal finished
        finished = True
        state.in_progress.pop(response_id, None)
        if events is None:
            await _finish(state, req, items, entry, builder, failed)
            return
        try:
            await events.end()  # all in the store before the final Response
            entry.events, entry.events_whole = events.stored, events.whole
            await _finish(state, req, items, entry, builder, failed)
        finally:
            state.event_logs.pop(response_id, None)
            events.close()

    async def run(receive, send, started: bool = False) -> None:
        failed = True
        shape = ResponseStream(builder) if events is None else Recorded(ResponseStream(builder), events)
        try:
            failed = await respond(gen, shape, stream=req.stream, receive=receive, send=send,
                                   keepalive_s=settings.http.sse_keepalive_s, before_last=before_last, started=started)
        finally:
            if not finished:  # the client left, or it failed before a byte went out (in the background: shutdown)
                await before_last(failed)

    if not req.background:
        await run(http.receive, http.send)
        return
    try:  # a 429 or 503 now, while the client still waits for the create's answer
        await gen.start()
    except BaseException:
        await before_last(True)
        raise
    if events is not None:
        state.event_logs[response_id] = events
    task = asyncio.create_task(run(_never, _discard, started=True))  # the answer is the store's, polled by id
    state.background.add(task)
    task.add_done_callback(state.background.discard)
    if events is None:
        await send_response(http.send, 200, msgspec.json.encode(entry.response))
    else:  # its events as they come, as any reader of them (GET .../{id}?stream=true) gets them
        await send_events(http, response_id, -1)


async def _never() -> dict:
    """A background response's client: it never disconnects (POST .../cancel ends it)."""
    await asyncio.Event().wait()
    return {}


async def _discard(message: dict) -> None:
    """Where a background response's body goes: nowhere, the store has it."""


async def stop_background(state: WorkerState) -> None:
    """At the worker's shutdown (after the launcher's drain): background responses still running end, each stored
    as failed, before the store closes."""
    tasks = list(state.background)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _cancel(gen: Generation, builder: ResponseBuilder) -> None:
    builder.status = "cancelled"
    gen.on_disconnect()  # ends the wait for output; the Generation aborts its engine work on the way out


async def _finish(state: WorkerState, req: ResponsesRequest, items: list[dict[str, Any]],
                  entry: StoredResponse | None, builder: ResponseBuilder, failed: bool) -> None:
    """The stored snapshot becomes the final Response (its TTL counts from now), and a
    conversation gets the turn's items. The client has its answer already: a store that fails
    here is logged (by the store) and the turn is not kept."""
    if builder.status == "in_progress":
        builder.status = "failed" if failed else "cancelled"  # an error, or the client left
        if failed and builder.error is None:
            builder.error = {"code": "server_error", "message": "The response failed before it finished."}
    try:
        if entry is not None and await state.store.get_response(entry.id) is not None:  # not deleted meanwhile
            entry.response = builder.response()
            entry.messages = [*entry.messages, *items_to_messages(builder.output, "output")]
            await state.store.put_response(entry)
        if (conversation_id := conversation_id_of(req.conversation)) and builder.status in ("completed", "incomplete"):
            await append_items(state, conversation_id, [*items, *builder.output])
    except StoreUnavailable:
        pass


async def count_input_tokens(http: HTTPRequest) -> None:
    """POST /v1/responses/input_tokens: the prompt's token count, as the create request would build it."""
    req = decode(http.body)
    await resolve_model(http.state, req.model)
    *_, (prompt_ids, _) = await prepare(http.state, req)
    await send_response(http.send, 200, msgspec.json.encode({"object": "response.input_tokens",
                                                         "input_tokens": len(prompt_ids)}))
