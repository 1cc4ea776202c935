"""POST /v1/completions: a prompt (text or token ids, one or a batch) -> engine -> text."""
from __future__ import annotations

from asgi.engine_link.generate import Generation, new_request_id
from asgi.errors import APIError
from asgi.http.access_log import log_request_content
from asgi.http.request_context import current
from asgi.http.router import HTTPRequest
from asgi.output.completion_format import CompletionFormatter
from asgi.output.logprobs_format import CompletionLogprobs
from asgi.output.respond import ChunkStream, respond
from asgi.prompt.encoding import encode_texts
from asgi.requests.nvext import NvExtReply
from asgi.requests.sampling import sampling_params
from asgi.requests.schemas import completion_decoder, decode_request, prompt_batch, stop_strings, stream_usage
from asgi.requests.structured import load_checker
from asgi.state import WorkerState

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for this endpoint


async def tokenize_prompts(state: WorkerState, prompts: list[str] | list[list[int]]) -> list[list[int]]:
    if isinstance(prompts[0], str):
        prompts = await encode_texts(state.tokenizer, prompts, add_special_tokens=True)
        if not all(prompts):
            raise APIError(400, "`prompt` must not be empty.", param="prompt")
        return prompts
    vocab_size = state.settings.limits.vocab_size
    for i, ids in enumerate(prompts):
        if any(t < 0 or t >= vocab_size for t in ids):
            raise APIError(400, f"Token ids must be between 0 and {vocab_size - 1}.", param=f"prompt[{i}]")
    return prompts


async def completions(http: HTTPRequest) -> None:
    state: WorkerState = http.state
    req = decode_request(completion_decoder, http.body, state.model_id)
    if (ctx := current()) is not None:
        ctx.model = state.model_id
    log_request_content(state.settings.log_requests, req)
    stop = stop_strings(req)
    batch = prompt_batch(req.prompt)
    prompts = await tokenize_prompts(state, batch)
    await load_checker(req)
    max_tokens = req.max_tokens if req.max_tokens is not None else DEFAULT_MAX_TOKENS
    max_model_len = state.settings.limits.max_model_len
    longest = max(len(ids) for ids in prompts)  # one check covers the batch
    params = sampling_params(req, max_tokens=max_tokens, prompt_len=longest, max_model_len=max_model_len,
                             prompt_param="prompt", vocab_size=state.settings.limits.vocab_size,
                             logprobs=req.logprobs)
    request_id = new_request_id("cmpl")
    make_detok = state.detokenizer(stop=stop, skip_special_tokens=req.skip_special_tokens,
                                   include_stop=req.include_stop_str_in_output)
    n = req.n or 1
    gen = Generation(state.client, request_id, prompts, params, make_detok, n=n)
    include_usage, continuous_usage = stream_usage(req)
    echo_texts = None
    if req.echo:  # a text prompt as sent; token ids decoded as the output is
        echo_texts = batch if isinstance(batch[0], str) else state.tokenizer.decode_batch(
            batch, skip_special_tokens=req.skip_special_tokens)
    num_top = req.logprobs
    fmt = CompletionFormatter(request_id, state.model_id, gen.num_choices, include_usage, n=n, echo_texts=echo_texts,
                              make_logprobs=None if num_top is None else
                              (lambda: CompletionLogprobs(state.token_texts, num_top)))
    shape = ChunkStream(fmt, include_usage=include_usage, continuous_usage=continuous_usage,
                        nvext=NvExtReply.of(req.nvext, prompts, state.decode_prompt))
    await respond(gen, shape, stream=req.stream, receive=http.receive, send=http.send,
                  keepalive_s=state.settings.sse_keepalive_s)
