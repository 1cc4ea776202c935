"""POST /v1/completions: a prompt (text or token ids, one or a batch) -> engine -> text."""
from __future__ import annotations

import time

import msgspec

from asgi.access_log import log_request_content
from asgi.errors import APIError
from asgi.generate import ChoiceDelta, Generation, Usage, new_request_id
from asgi.request_context import current
from asgi.respond import respond
from asgi.sampling import sampling_params
from asgi.schemas import completion_decoder, prompt_batch, decode_request, stop_strings
from asgi.state import WorkerState

_encode = msgspec.json.encode
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for this endpoint


class CompletionFormatter:
    def __init__(self, request_id: str, model: str, include_usage: bool):
        self.head = {"id": request_id, "object": "text_completion", "created": int(time.time()), "model": model}
        self.include_usage = include_usage

    def opening_chunks(self) -> list[bytes]:
        return []

    def chunk(self, deltas: list[ChoiceDelta]) -> bytes:
        # finish_reason is null until a choice ends, as OpenAI streams it; the spec (and so the
        # SDK's strict mode) reuses the non-streamed schema, where it is not nullable.
        body = {**self.head, "choices": [{"index": d.index, "text": d.text, "logprobs": None,
                                          "finish_reason": d.finish_reason} for d in deltas]}
        if self.include_usage:
            body["usage"] = None
        return _encode(body)

    def usage_chunk(self, usage: Usage) -> bytes:
        return _encode({**self.head, "choices": [], "usage": usage.as_dict()})

    def body(self, texts: list[str], finish_reasons: list[str | None], usage: Usage) -> bytes:
        choices = [{"index": i, "text": text, "logprobs": None, "finish_reason": finish_reasons[i]}
                   for i, text in enumerate(texts)]
        return _encode({**self.head, "choices": choices, "usage": usage.as_dict()})


def tokenize_prompts(state: WorkerState, prompts: list[str] | list[list[int]]) -> list[list[int]]:
    if isinstance(prompts[0], str):
        prompts = [e.ids for e in state.tokenizer.encode_batch(prompts, add_special_tokens=True)]
        if not all(prompts):
            raise APIError(400, "`prompt` must not be empty.", param="prompt")
        return prompts
    vocab_size = state.settings.limits.vocab_size
    for i, ids in enumerate(prompts):
        if any(t < 0 or t >= vocab_size for t in ids):
            raise APIError(400, f"Token ids must be between 0 and {vocab_size - 1}.", param=f"prompt[{i}]")
    return prompts


async def completions(state: WorkerState, body: bytes, receive, send) -> None:
    req = decode_request(completion_decoder, body, state.model_id)
    if (ctx := current()) is not None:
        ctx.model = state.model_id
    log_request_content(state.settings.log_requests, req)
    stop = stop_strings(req)
    prompts = tokenize_prompts(state, prompt_batch(req.prompt))
    max_tokens = req.max_tokens if req.max_tokens is not None else DEFAULT_MAX_TOKENS
    max_model_len = state.settings.limits.max_model_len
    longest = max(len(ids) for ids in prompts)  # one check covers the batch
    params = sampling_params(req, max_tokens=max_tokens, prompt_len=longest, max_model_len=max_model_len,
                             prompt_param="prompt")
    request_id = new_request_id("cmpl")
    make_detok = state.detokenizer(stop=stop, skip_special_tokens=req.skip_special_tokens,
                                   include_stop=req.include_stop_str_in_output)
    gen = Generation(state.client, request_id, prompts, params, make_detok)
    include_usage = bool(req.stream and req.stream_options and req.stream_options.include_usage)
    fmt = CompletionFormatter(request_id, state.model_id, include_usage)
    await respond(gen, fmt, stream=req.stream, receive=receive, send=send,
                  keepalive_s=state.settings.sse_keepalive_s, include_usage=include_usage)
