"""llama.cpp's native routes: POST /completion (a prompt, as llama.cpp's own clients and UIs send it), POST /infill
(fill-in-the-middle with repository context, for editors: llama.vim, llama.vscode), GET /props (the context size,
slots and chat template clients read) and POST /apply-template (the chat template's text for messages). The requests:
asgi/requests/llama_request.py and infill_request.py; the answer: asgi/output/llama_format.py."""
from __future__ import annotations

from rill.asgi.engine_link.generate import Generation, new_request_id
from rill.asgi.errors import APIError, renamed
from rill.asgi.http.access_log import log_request_content
from rill.asgi.http.primitives import send_response
from rill.asgi.http.router import HTTPRequest
from rill.asgi.output.llama_format import LlamaAnswer
from rill.asgi.output.logprobs_format import ChatLogprobs
from rill.asgi.output.respond import respond
from rill.asgi.prompt.chat_messages import render_prompt
from rill.asgi.prompt.encoding import tokenize_prompts
from rill.asgi.requests.body import decode_json
from rill.asgi.requests.infill_request import infill_decoder, infill_prompt
from rill.asgi.requests.llama_request import LLAMA_NAMES, LlamaSampling, as_completion, completion_decoder
from rill.asgi.requests.model_choice import resolve_model
from rill.asgi.requests.priority import request_priority
from rill.asgi.requests.sampling import sampling_params
from rill.asgi.requests.structured import load_checker
from rill.asgi.routes.tokenize import VERSION, chat_form_decoder
from rill.asgi.state import WorkerState, dumps


async def completion(http: HTTPRequest) -> None:
    state: WorkerState = http.state
    req = decode_json(completion_decoder, http.body)
    lora = await resolve_model(state, req.model)
    log_request_content(state.settings.http.log_requests, req)
    prompt_ids = (await tokenize_prompts(state.tokenizer, [req.prompt], state.settings.limits.vocab_size, "prompt"))[0]
    await _run(http, req, lora, prompt_ids, "cmpl", "prompt")


async def infill(http: HTTPRequest) -> None:
    state: WorkerState = http.state
    req = decode_json(infill_decoder, http.body)
    lora = await resolve_model(state, req.model)
    log_request_content(state.settings.http.log_requests, req)
    if state.fim_tokens is None:
        raise APIError(400, "/infill needs a model trained for fill-in-the-middle: the served model's tokenizer has "
                            "no FIM tokens (<fim_prefix>, <|fim_prefix|>, ...).", param="input_prefix")
    await _run(http, req, lora, await infill_prompt(state.tokenizer, state.fim_tokens, req), "infill", "input_prefix")


async def _run(http: HTTPRequest, req: LlamaSampling, lora: str | None, prompt_ids: list[int], prefix: str,
               prompt_param: str) -> None:
    state: WorkerState = http.state
    limits = state.settings.limits
    room = max(limits.max_model_len - len(prompt_ids), 1)  # n_predict -1: until the model stops or the context is full
    max_tokens = room if req.n_predict < 0 else max(req.n_predict, 1)
    model = req.model or state.model_id
    completion = as_completion(req, model, prompt_ids, max_tokens)
    try:  # checked as a completion's fields, named as llama.cpp's
        await load_checker(completion)  # json_schema, grammar
        params = sampling_params(completion, max_tokens=max_tokens, prompt_len=len(prompt_ids),
                                 max_model_len=limits.max_model_len, prompt_param=prompt_param,
                                 max_tokens_param="n_predict", vocab_size=limits.vocab_size,
                                 logprobs=req.n_probs or None, defaults=state.sampling_defaults,
                                 tokenizer=state.tokenizer, max_logprobs=state.settings.http.max_logprobs)
    except APIError as exc:
        raise renamed(exc, LLAMA_NAMES) from None
    params.lora = lora
    params.priority = request_priority(req.priority, limits)
    gen = Generation(state.client, new_request_id(prefix), [prompt_ids], params,
                     state.detokenizer(stop=completion.stop or [], skip_special_tokens=True, include_stop=False),
                     cache_salt=req.cache_salt, return_token_ids=req.return_tokens)
    probs = ChatLogprobs(state.token_texts, req.n_probs) if req.n_probs else None
    await respond(gen, LlamaAnswer(model, req.return_tokens, probs), stream=req.stream, receive=http.receive,
                  send=http.send, keepalive_s=state.settings.http.sse_keepalive_s)


async def props(http: HTTPRequest) -> None:
    state: WorkerState = http.state
    limits = state.settings.limits
    defaults = {k: state.sampling_defaults[k] for k in ("temperature", "top_k", "top_p", "min_p")
                if k in state.sampling_defaults}
    await send_response(http.send, 200, dumps({
        "default_generation_settings": {"n_ctx": limits.max_model_len, "model": state.model_id,
                                        "params": {"n_predict": -1, **defaults}},
        "total_slots": limits.max_num_seqs, "model_path": limits.model_dir, "chat_template": state.template.source,
        "modalities": {"vision": False, "audio": False}, "build_info": f"rill {VERSION}"}))


async def apply_template(http: HTTPRequest) -> None:
    """The text the chat template writes for the messages (and the chat fields that shape it), not tokenized."""
    state: WorkerState = http.state
    req = decode_json(chat_form_decoder, http.body)
    await resolve_model(state, req.model)
    await send_response(http.send, 200, dumps({"prompt": render_prompt(state, req)}))
