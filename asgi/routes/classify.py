"""POST /classify and /v1/classify (vLLM's and SGLang's): each input is an engine request that a sequence
classifier scores instead of sampling, batched by the engine like embeddings; the answer names each input's
likeliest label and gives its probabilities (docs/classify.md)."""
from __future__ import annotations

import msgspec

from rill.asgi.engine_link.generate import Generation, new_request_id
from rill.asgi.errors import APIError
from rill.asgi.http.router import HTTPRequest
from rill.asgi.output.respond import respond
from rill.asgi.output.score_format import ClassifyList
from rill.asgi.prompt.encoding import tokenize_prompts
from rill.asgi.prompt.truncation import truncated_prompts
from rill.asgi.requests.body import decode_json
from rill.asgi.requests.classify_request import ClassifyRequest, classify_decoder
from rill.asgi.requests.model_choice import resolve_model
from rill.asgi.requests.priority import request_priority
from rill.asgi.requests.rerank_request import use_activation
from rill.asgi.requests.schemas import prompt_batch
from rill.asgi.state import WorkerState
from rill.ipc.protocol import SamplingParams

CLASSIFY = SamplingParams(max_tokens=1, temperature=0.0, embed=True)  # the runner's "embedding" is the scores


async def classify(http: HTTPRequest) -> None:
    state: WorkerState = http.state
    req: ClassifyRequest = decode_json(classify_decoder, http.body)
    await resolve_model(state, req.model, adapters=False)
    limits = state.settings.limits
    if limits.scorer != "classify":
        raise APIError(400, "This server does not serve classify: serve a *ForSequenceClassification model of "
                            "several labels, or one of one label with --task classify.", param="model",
                       code="unsupported_model")
    batch = prompt_batch(req.input, "input")  # at most MAX_PROMPTS inputs
    specials = req.add_special_tokens
    prompts = await tokenize_prompts(state.tokenizer, batch, limits.vocab_size, "input", add_special_tokens=specials)
    prompts = truncated_prompts(state.tokenizer, batch, prompts, req.truncate_prompt_tokens, limits.max_model_len,
                                specials)
    for i, ids in enumerate(prompts):
        if len(ids) > limits.max_model_len:
            raise APIError(400, f"`input[{i}]` has {len(ids)} tokens; this model takes at most "
                                f"{limits.max_model_len}.", param=f"input[{i}]", code="context_length_exceeded")
    make_detok = state.detokenizer(stop=[], skip_special_tokens=True, include_stop=False)
    priority = request_priority(req.priority, limits)
    params = msgspec.structs.replace(CLASSIFY, priority=priority) if priority else CLASSIFY
    gen = Generation(state.client, new_request_id("classify"), prompts, params, make_detok)
    await respond(gen, ClassifyList(state.model_id, use_activation(req), limits.labels), stream=False,
                  receive=http.receive,
                  send=http.send, keepalive_s=state.settings.http.sse_keepalive_s)
