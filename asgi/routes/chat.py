"""POST /v1/chat/completions: messages -> chat template -> engine -> chunks or one body."""
from __future__ import annotations

from rill.asgi.engine_link.generate import Generation, new_request_id
from rill.asgi.http.access_log import log_request_content
from rill.asgi.http.router import HTTPRequest
from rill.asgi.output.chat_format import ChatFormatter
from rill.asgi.output.logprobs_format import ChatLogprobs
from rill.asgi.output.respond import ChunkStream, respond
from rill.asgi.output.token_text import logprob_texts
from rill.asgi.requests.beam_search import beam_search
from rill.asgi.requests.generation_plan import plan_generation
from rill.asgi.requests.model_choice import resolve_model
from rill.asgi.requests.nvext import NvExtReply
from rill.asgi.requests.prediction import prediction_ids
from rill.asgi.requests.schemas import chat_decoder, decode_request, echoed_text, stop_strings, stream_usage
from rill.asgi.routes.stored_chats import keeper
from rill.asgi.state import WorkerState


async def chat_completions(http: HTTPRequest) -> None:
    state: WorkerState = http.state
    req = decode_request(chat_decoder, http.body)
    lora = await resolve_model(state, req.model)  # the served model or a LoRA adapter
    log_request_content(state.settings.http.log_requests, req)
    stop = stop_strings(req)
    num_top = (req.top_logprobs or 0) if req.logprobs else None
    plan = await plan_generation(state, req, max_tokens=req.max_completion_tokens if req.max_completion_tokens is not None
                                 else req.max_tokens, stop=stop, skip_special_tokens=req.skip_special_tokens,
                                 include_stop=req.include_stop_str_in_output, logprobs=num_top,
                                 prompt_logprobs=req.prompt_logprobs, lora=lora)
    prompt_ids, params = plan.prompt_ids, plan.params
    params.prediction = await prediction_ids(state.tokenizer, req.prediction, state.settings.limits.max_model_len)
    request_id = new_request_id("chatcmpl")
    n = req.n or 1
    with_ids = bool(req.return_token_ids)
    gen = beam_search(state, req, params, [prompt_ids], plan.make_detok, request_id) or Generation(
        state.client, request_id, [prompt_ids], params, plan.make_detok, n=n, cache_salt=req.cache_salt,
        return_token_ids=with_ids)
    include_usage, continuous_usage = stream_usage(req)
    token_names = logprob_texts(state.token_texts, req.return_tokens_as_token_ids)
    fmt = ChatFormatter(request_id, req.model, n, include_usage, make_parser=plan.make_parser,
                        logprobs=None if num_top is None else ChatLogprobs(token_names, num_top),
                        prompt_scores=None if req.prompt_logprobs is None else (state.token_texts, req.prompt_logprobs),
                        prompt_token_ids=prompt_ids if with_ids else None, echo=echoed_text(req))
    shape = ChunkStream(fmt, include_usage=include_usage, continuous_usage=continuous_usage,
                        nvext=NvExtReply.of(req.nvext, [prompt_ids], state.decode_prompt))
    await respond(gen, shape, stream=req.stream, receive=http.receive, send=http.send,
                  keepalive_s=state.settings.http.sse_keepalive_s, before_last=keeper(state, req, fmt, gen))
