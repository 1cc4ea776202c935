"""POST /infill: llama.cpp's fill-in-the-middle with repository context, for editors (llama.vim, llama.vscode).
The prompt: asgi/requests/infill_request.py; the answer: asgi/output/infill_format.py."""
from __future__ import annotations

from rill.asgi.engine_link.generate import Generation, new_request_id
from rill.asgi.errors import APIError
from rill.asgi.http.access_log import log_request_content
from rill.asgi.http.router import HTTPRequest
from rill.asgi.output.infill_format import InfillStream
from rill.asgi.output.respond import respond
from rill.asgi.requests.body import decode_json
from rill.asgi.requests.infill_request import as_completion, infill_decoder, infill_prompt
from rill.asgi.requests.model_choice import resolve_model
from rill.asgi.requests.priority import request_priority
from rill.asgi.requests.sampling import sampling_params
from rill.asgi.state import WorkerState


async def infill(http: HTTPRequest) -> None:
    state: WorkerState = http.state
    req = decode_json(infill_decoder, http.body)
    lora = await resolve_model(state, req.model)
    log_request_content(state.settings.http.log_requests, req)
    if state.fim_tokens is None:
        raise APIError(400, "/infill needs a model trained for fill-in-the-middle: the served model's tokenizer has "
                            "no FIM tokens (<fim_prefix>, <|fim_prefix|>, ...).", param="input_prefix")
    prompt_ids = await infill_prompt(state.tokenizer, state.fim_tokens, req)
    limits = state.settings.limits
    room = max(limits.max_model_len - len(prompt_ids), 1)  # n_predict -1: until the model stops or the context is full
    max_tokens = room if req.n_predict < 0 else max(req.n_predict, 1)
    completion = as_completion(req, req.model or state.model_id, prompt_ids, max_tokens)
    params = sampling_params(completion, max_tokens=max_tokens, prompt_len=len(prompt_ids),
                             max_model_len=limits.max_model_len, prompt_param="input_prefix",
                             max_tokens_param="n_predict", vocab_size=limits.vocab_size,
                             defaults=state.sampling_defaults, tokenizer=state.tokenizer)
    params.lora = lora
    params.priority = request_priority(req.priority, limits)
    stop = completion.stop or []
    gen = Generation(state.client, new_request_id("infill"), [prompt_ids], params,
                     state.detokenizer(stop=stop, skip_special_tokens=True, include_stop=False),
                     cache_salt=req.cache_salt)
    await respond(gen, InfillStream(req.model or state.model_id), stream=req.stream, receive=http.receive,
                  send=http.send, keepalive_s=state.settings.http.sse_keepalive_s)
