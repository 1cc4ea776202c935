"""Text Generation Inference's native routes (asgi/requests/tgi_request.py, asgi/output/tgi_format.py):
POST /generate_stream, POST / (TGI's own client's and huggingface_hub's InferenceClient.text_generation), GET
/info, and POST /generate when its body is TGI's (`inputs`; SGLang's otherwise: asgi/routes/sglang.py)."""
from __future__ import annotations

from rill.asgi.engine_link.generate import Generation, new_request_id
from rill.asgi.errors import APIError, renamed
from rill.asgi.http.access_log import log_request_content
from rill.asgi.http.primitives import send_response
from rill.asgi.http.router import HTTPRequest
from rill.asgi.output.respond import respond
from rill.asgi.output.tgi_format import TGIAnswer
from rill.asgi.prompt.encoding import tokenize_prompts
from rill.asgi.prompt.truncation import truncated_prompts
from rill.asgi.requests.body import decode_json
from rill.asgi.requests.model_choice import resolve_model
from rill.asgi.requests.sampling import sampling_params
from rill.asgi.requests.schemas import stop_strings
from rill.asgi.requests.structured import load_checker
from rill.asgi.requests.tgi_request import TGI_NAMES, TGIParameters, as_completion, tgi_decoder
from rill.asgi.routes.tokenize import VERSION
from rill.asgi.state import WorkerState, dumps


async def generate(http: HTTPRequest, *, stream: bool | None = False, as_list: bool = False) -> None:
    """`stream`: None takes the body's own (POST /)."""
    state: WorkerState = http.state
    req = decode_json(tgi_decoder, http.body)
    p = req.parameters or TGIParameters()
    lora = await resolve_model(state, p.adapter_id) if p.adapter_id else ""
    log_request_content(state.settings.http.log_requests, req)
    limits = state.settings.limits
    completion = as_completion(req, state.model_id)
    prompts = await tokenize_prompts(state.tokenizer, [req.inputs], limits.vocab_size, "inputs")
    try:  # checked as a completion's fields, named as TGI's
        prompts = truncated_prompts(state.tokenizer, [req.inputs], prompts, p.truncate, limits.max_model_len, True)
        await load_checker(completion)
        params = sampling_params(completion, max_tokens=completion.max_tokens, prompt_len=len(prompts[0]),
                                 max_model_len=limits.max_model_len, prompt_param="inputs",
                                 max_tokens_param="parameters.max_new_tokens", vocab_size=limits.vocab_size,
                                 logprobs=0, defaults=state.sampling_defaults, tokenizer=state.tokenizer)
    except APIError as exc:
        raise renamed(exc, TGI_NAMES) from None
    params.lora = lora
    gen = Generation(state.client, new_request_id("tgi"), prompts, params,
                     state.detokenizer(stop=stop_strings(completion), skip_special_tokens=True, include_stop=False),
                     return_token_ids=True)
    shape = TGIAnswer(state.token_texts, frozenset(limits.eos_token_ids), prefix=req.inputs if p.return_full_text
                      else "", details=p.details, seed=p.seed, as_list=as_list)
    await respond(gen, shape, stream=req.stream if stream is None else stream, receive=http.receive, send=http.send,
                  keepalive_s=state.settings.http.sse_keepalive_s)


async def generate_stream(http: HTTPRequest) -> None:
    await generate(http, stream=True)


async def compat_generate(http: HTTPRequest) -> None:
    """POST /: TGI's route for both, by the body's `stream`; not streamed, a list of one answer."""
    await generate(http, stream=None, as_list=True)


async def info(http: HTTPRequest) -> None:
    state: WorkerState = http.state
    limits = state.settings.limits
    await send_response(http.send, 200, dumps({
        "model_id": state.model_id, "model_sha": None, "model_dtype": limits.dtype, "model_device_type": "cpu",
        "model_pipeline_tag": "text-generation", "max_concurrent_requests": limits.max_num_seqs, "max_best_of": 1,
        "max_stop_sequences": 16, "max_input_tokens": limits.max_model_len - 1, "max_total_tokens": limits.max_model_len,
        "validation_workers": 1, "max_client_batch_size": 1, "router": "rill", "version": VERSION}))
