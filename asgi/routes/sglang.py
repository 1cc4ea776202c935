"""SGLang's native POST /generate (asgi/requests/sglang_request.py, asgi/output/sglang_format.py): what SGLang's
clients, `sglang.bench_serving --backend sglang` and RL rollout loops send, over the completions machinery."""
from __future__ import annotations

from rill.asgi.engine_link.generate import Generation, new_request_id
from rill.asgi.errors import APIError, renamed
from rill.asgi.http.access_log import log_request_content
from rill.asgi.http.router import HTTPRequest
from rill.asgi.output.respond import respond
from rill.asgi.output.sglang_format import SGLangAnswer
from rill.asgi.prompt.encoding import tokenize_prompts
from rill.asgi.requests.body import decode_json, has_key
from rill.asgi.requests.model_choice import resolve_model
from rill.asgi.requests.sampling import sampling_params
from rill.asgi.requests.schemas import check_choices, stop_strings
from rill.asgi.requests.sglang_request import SGLANG_NAMES, as_completion, generate_decoder, prompts_of
from rill.asgi.requests.structured import load_checker
from rill.asgi.routes import tgi
from rill.asgi.state import WorkerState


async def generate(http: HTTPRequest) -> None:
    """SGLang's body; TGI's (its `inputs`) goes to TGI's route, which shares the path."""
    if has_key(http.body, "inputs"):
        return await tgi.generate(http)
    state: WorkerState = http.state
    req = decode_json(generate_decoder, http.body)
    lora = await resolve_model(state, req.model or req.lora_path)
    log_request_content(state.settings.http.log_requests, req)
    batch, is_batch = prompts_of(req)
    check_choices(len(batch), 1)
    limits = state.settings.limits
    param = "text" if req.text is not None else "input_ids"
    prompts = await tokenize_prompts(state.tokenizer, batch, limits.vocab_size, param)
    completion = as_completion(req, req.model or state.model_id)
    try:  # checked as a completion's fields, named as SGLang's
        await load_checker(completion)
        params = sampling_params(completion, max_tokens=completion.max_tokens,
                                 prompt_len=max(len(ids) for ids in prompts), max_model_len=limits.max_model_len,
                                 prompt_param=param, max_tokens_param="sampling_params.max_new_tokens",
                                 vocab_size=limits.vocab_size, defaults=state.sampling_defaults,
                                 tokenizer=state.tokenizer)
    except APIError as exc:
        raise renamed(exc, SGLANG_NAMES) from None
    params.lora = lora
    request_id = new_request_id("sgl")
    gen = Generation(state.client, request_id, prompts, params,
                     state.detokenizer(stop=stop_strings(completion), skip_special_tokens=completion.skip_special_tokens,
                                       include_stop=False), return_token_ids=True)
    shape = SGLangAnswer(request_id, len(prompts), completion.max_tokens, is_batch)
    await respond(gen, shape, stream=req.stream, receive=http.receive, send=http.send,
                  keepalive_s=state.settings.http.sse_keepalive_s)
