"""POST /v1/chat/completions: messages -> chat template -> engine -> chunks or one body."""
from __future__ import annotations

import time

import msgspec

from asgi.access_log import log_request_content
from asgi.errors import APIError
from asgi.generate import ChoiceDelta, Generation, Usage, new_request_id
from asgi.request_context import current
from asgi.respond import respond
from asgi.sampling import sampling_params
from asgi.schemas import ChatCompletionRequest, chat_decoder, decode_request, stop_strings
from asgi.state import WorkerState
from asgi.templating import TemplateError

_encode = msgspec.json.encode


def render_messages(state: WorkerState, req: ChatCompletionRequest) -> list[int]:
    messages = []
    for i, m in enumerate(req.messages):
        content = m.content
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if part.type != "text" or part.text is None:
                    raise APIError(400, f"Content parts of type `{part.type}` are not supported; only text.",
                                   param=f"messages[{i}].content[{j}].type")
                parts.append(part.text)
            content = "".join(parts)
        message = {"role": m.role, "content": content}
        if m.name is not None:
            message["name"] = m.name
        messages.append(message)
    extra = req.chat_template_kwargs or {}
    if reserved := {"messages", "add_generation_prompt"} & extra.keys():
        raise APIError(400, f"`chat_template_kwargs` must not set {sorted(reserved)}; use the request fields.",
                       param="chat_template_kwargs")
    try:
        text = state.template.render(messages, add_generation_prompt=req.add_generation_prompt, **extra)
    except TemplateError as exc:
        raise APIError(400, f"The chat template could not render these messages: {exc}", param="messages") from None
    return state.tokenizer.encode(text, add_special_tokens=False).ids


class ChatFormatter:
    def __init__(self, request_id: str, model: str, num_choices: int, include_usage: bool):
        self.head = {"id": request_id, "object": "chat.completion.chunk", "created": int(time.time()),
                     "model": model}
        self.num_choices = num_choices
        self.include_usage = include_usage

    def _chunk(self, choices: list[dict]) -> bytes:
        body = {**self.head, "choices": choices}
        if self.include_usage:
            body["usage"] = None
        return _encode(body)

    def opening_chunks(self) -> list[bytes]:
        return [self._chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None}]) for i in range(self.num_choices)]

    def chunk(self, deltas: list[ChoiceDelta]) -> bytes:
        return self._chunk([{"index": d.index, "delta": {"content": d.text} if d.text else {}, "logprobs": None,
                             "finish_reason": d.finish_reason} for d in deltas])

    def usage_chunk(self, usage: Usage) -> bytes:
        return _encode({**self.head, "choices": [], "usage": usage.as_dict()})

    def body(self, texts: list[str], finish_reasons: list[str | None], usage: Usage) -> bytes:
        choices = [{"index": i, "message": {"role": "assistant", "content": text, "refusal": None},
                    "logprobs": None, "finish_reason": finish_reasons[i]} for i, text in enumerate(texts)]
        return _encode({**self.head, "object": "chat.completion", "choices": choices, "usage": usage.as_dict()})


async def chat_completions(state: WorkerState, body: bytes, receive, send) -> None:
    req = decode_request(chat_decoder, body, state.model_id)
    if (ctx := current()) is not None:
        ctx.model = state.model_id
    log_request_content(state.settings.log_requests, req)
    stop = stop_strings(req)
    prompt_ids = render_messages(state, req)
    limit = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    params = sampling_params(req, max_tokens=limit, prompt_len=len(prompt_ids),
                             max_model_len=state.settings.limits.max_model_len, prompt_param="messages")
    request_id = new_request_id("chatcmpl")
    make_detok = state.detokenizer(stop=stop, skip_special_tokens=req.skip_special_tokens,
                                   include_stop=req.include_stop_str_in_output)
    gen = Generation(state.client, request_id, [prompt_ids], params, make_detok)
    include_usage = bool(req.stream and req.stream_options and req.stream_options.include_usage)
    fmt = ChatFormatter(request_id, state.model_id, 1, include_usage)
    await respond(gen, fmt, stream=req.stream, receive=receive, send=send,
                  keepalive_s=state.settings.sse_keepalive_s, include_usage=include_usage)
