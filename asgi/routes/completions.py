"""POST /v1/completions: a prompt (text or token ids, one or a batch) -> engine -> text."""
from __future__ import annotations

from rill.asgi.engine_link.best_of import BestOfGeneration
from rill.asgi.engine_link.generate import Generation, new_request_id
from rill.asgi.errors import APIError
from rill.asgi.http.access_log import log_request_content
from rill.asgi.http.router import HTTPRequest
from rill.asgi.output.completion_format import CompletionFormatter, Echo, PromptScores
from rill.asgi.output.logprobs_format import CompletionLogprobs
from rill.asgi.output.respond import ChunkStream, respond
from rill.asgi.output.token_text import logprob_texts
from rill.asgi.prompt.encoding import tokenize_prompts
from rill.asgi.prompt.fim import fim_prompts
from rill.asgi.prompt.truncation import truncated_prompts
from rill.asgi.requests.beam_search import beam_search
from rill.asgi.requests.best_of import candidates_per_prompt
from rill.asgi.requests.model_choice import resolve_model
from rill.asgi.requests.nvext import NvExtReply
from rill.asgi.requests.priority import request_priority
from rill.asgi.requests.sampling import sampling_params
from rill.asgi.requests.schemas import (
    check_choices,
    completion_decoder,
    decode_request,
    prompt_batch,
    stop_strings,
    stream_usage,
)
from rill.asgi.requests.structured import load_checker
from rill.asgi.state import WorkerState

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for this endpoint


async def completions(http: HTTPRequest) -> None:
    state: WorkerState = http.state
    req = decode_request(completion_decoder, http.body)
    lora = await resolve_model(state, req.model)  # the served model or a LoRA adapter
    log_request_content(state.settings.http.log_requests, req)
    stop = stop_strings(req)
    batch = prompt_batch(req.prompt)
    best_of = candidates_per_prompt(req)
    check_choices(len(batch), best_of)
    vocab_size = state.settings.limits.vocab_size
    max_model_len = state.settings.limits.max_model_len
    if req.suffix is not None and (req.suffix or state.fim_tokens is not None):  # fill in the middle
        if req.echo:
            raise APIError(400, "`suffix` cannot be combined with `echo`.", param="suffix")
        if req.truncate_prompt_tokens is not None:  # cut from the left, the prefix would lose its opening token
            raise APIError(400, "`suffix` cannot be combined with `truncate_prompt_tokens`.", param="suffix")
        prompts = await fim_prompts(state.tokenizer, state.fim_tokens, batch, req.suffix, vocab_size)
    else:
        specials = req.add_special_tokens is not False
        whole = await tokenize_prompts(state.tokenizer, batch, vocab_size, "prompt", add_special_tokens=specials)
        prompts = truncated_prompts(state.tokenizer, batch, whole, req.truncate_prompt_tokens, max_model_len,
                                    specials)
        if prompts is not whole:
            batch = prompts  # `echo` gives back what the model read
    await load_checker(req)
    max_tokens = req.max_tokens if req.max_tokens is not None else DEFAULT_MAX_TOKENS
    longest = max(len(ids) for ids in prompts)  # one check covers the batch
    num_top = req.logprobs
    echo_logprobs = req.echo and num_top is not None  # the prompt's tokens open the choice's logprobs
    wanted = [k for k in (num_top if echo_logprobs else None, req.prompt_logprobs) if k is not None]
    params = sampling_params(req, max_tokens=max_tokens, prompt_len=longest, max_model_len=max_model_len,
                             prompt_param="prompt", vocab_size=state.settings.limits.vocab_size,
                             logprobs=0 if num_top is None and best_of > (req.n or 1) else num_top,
                             prompt_logprobs=max(wanted, default=None),
                             defaults=state.sampling_defaults, tokenizer=state.tokenizer,
                             max_logprobs=state.settings.http.max_logprobs)
    params.lora = lora
    params.priority = request_priority(req.priority, state.settings.limits)
    request_id = new_request_id("cmpl")
    make_detok = state.detokenizer(stop=stop, skip_special_tokens=req.skip_special_tokens,
                                   include_stop=req.include_stop_str_in_output)
    n = req.n or 1
    with_ids = bool(req.return_token_ids)
    gen = beam_search(state, req, params, prompts, make_detok, request_id) or Generation(
        state.client, request_id, prompts, params, make_detok, n=best_of, cache_salt=req.cache_salt,
        return_token_ids=with_ids)
    if best_of > n:  # the n best of best_of candidates a prompt
        gen = BestOfGeneration(gen, n, keep_logprobs=num_top is not None)
    include_usage, continuous_usage = stream_usage(req)
    echo = None
    if req.echo:  # a text prompt as sent; token ids decoded as the output is
        texts = batch if isinstance(batch[0], str) else state.tokenizer.decode_batch(
            batch, skip_special_tokens=req.skip_special_tokens)
        echo = Echo(texts, [ids[0] for ids in prompts])
    token_names = logprob_texts(state.token_texts, req.return_tokens_as_token_ids)
    fmt = CompletionFormatter(request_id, req.model, gen.num_choices, include_usage, n=n, echo=echo,
                              make_logprobs=None if num_top is None else
                              (lambda: CompletionLogprobs(token_names, num_top)),
                              prompt_scores=None if req.prompt_logprobs is None else
                              PromptScores(state.token_texts, req.prompt_logprobs),
                              prompt_token_ids=prompts if with_ids else None)
    shape = ChunkStream(fmt, include_usage=include_usage, continuous_usage=continuous_usage,
                        nvext=NvExtReply.of(req.nvext, prompts, state.decode_prompt))
    await respond(gen, shape, stream=req.stream, receive=http.receive, send=http.send,
                  keepalive_s=state.settings.http.sse_keepalive_s)
