"""POST /classify and /v1/classify (vLLM's and SGLang's): each input is an engine request that a sequence
classifier scores instead of sampling, batched by the engine like embeddings; the answer names each input's
likeliest label and gives its probabilities (docs/classify.md)."""
from __future__ import annotations

from rill.asgi.errors import APIError
from rill.asgi.http.router import HTTPRequest
from rill.asgi.output.respond import respond
from rill.asgi.output.score_format import ClassifyList
from rill.asgi.prompt.chat_messages import render_messages
from rill.asgi.prompt.inputs import input_prompts, pooling
from rill.asgi.requests.body import decode_json, has_messages
from rill.asgi.requests.classify_request import classify_chat_decoder, classify_decoder
from rill.asgi.requests.model_choice import resolve_model
from rill.asgi.requests.rerank_request import use_activation
from rill.asgi.state import WorkerState


async def classify(http: HTTPRequest) -> None:
    state: WorkerState = http.state
    chat = has_messages(http.body)
    req = decode_json(classify_chat_decoder if chat else classify_decoder, http.body)
    await resolve_model(state, req.model, adapters=False)
    limits = state.settings.limits
    if limits.scorer != "classify":
        raise APIError(400, "This server does not serve classify: serve a *ForSequenceClassification model of "
                            "several labels, or one of one label with --task classify.", param="model",
                       code="unsupported_model")
    if chat:  # one input: the conversation as the chat template writes it
        ids = await render_messages(state, req)
        prompts = await input_prompts(state, req, [ids])
    else:
        prompts = await input_prompts(state, req)
    gen = pooling(state, req, prompts, "classify")
    await respond(gen, ClassifyList(state.model_id, use_activation(req), limits.labels), stream=False,
                  receive=http.receive, send=http.send, keepalive_s=state.settings.http.sse_keepalive_s)
