"""POST /classify and /v1/classify (vLLM's and SGLang's): each input is an engine request that a sequence
classifier scores instead of sampling, batched by the engine like embeddings; the answer names each input's
likeliest label and gives its probabilities (docs/classify.md). And vLLM's POST /pooling, the same request
answered with each input's pooled output alone: a classifier's scores, or an embedding model's vector."""
from __future__ import annotations

from rill.asgi.errors import APIError
from rill.asgi.http.router import HTTPRequest
from rill.asgi.output.respond import respond
from rill.asgi.output.score_format import ClassifyList, PoolList
from rill.asgi.prompt.chat_messages import render_messages
from rill.asgi.prompt.inputs import input_prompts, pooling
from rill.asgi.requests.body import decode_json, has_messages
from rill.asgi.requests.classify_request import classify_chat_decoder, classify_decoder
from rill.asgi.requests.model_choice import resolve_model
from rill.asgi.requests.rerank_request import use_activation
from rill.asgi.state import WorkerState


async def classify(http: HTTPRequest) -> None:
    state: WorkerState = http.state
    req, gen = await _pooled(http, "classify")
    await respond(gen, ClassifyList(state.model_id, use_activation(req), state.settings.limits.labels), stream=False,
                  receive=http.receive, send=http.send, keepalive_s=state.settings.http.sse_keepalive_s)


async def pool(http: HTTPRequest) -> None:
    state: WorkerState = http.state
    limits = state.settings.limits
    if limits.scorer != "classify" and not (limits.embedding_dim and not limits.scorer):
        raise APIError(400, "This server does not serve pooling: serve a classifier (docs/classify.md) or an "
                            "embedding model, or start it with --enable-embeddings.", param="model",
                       code="unsupported_model")
    req, gen = await _pooled(http, "pool")
    await respond(gen, PoolList(state.model_id, use_activation(req) if limits.scorer else None,
                                req.encoding_format == "base64"),
                  stream=False, receive=http.receive, send=http.send, keepalive_s=state.settings.http.sse_keepalive_s)


async def _pooled(http: HTTPRequest, prefix: str):
    """The request (its `input`, or `messages` as one input) and its Generation, for a server that can pool it."""
    state: WorkerState = http.state
    chat = has_messages(http.body)
    req = decode_json(classify_chat_decoder if chat else classify_decoder, http.body)
    await resolve_model(state, req.model, adapters=False)
    if prefix == "classify" and state.settings.limits.scorer != "classify":
        raise APIError(400, "This server does not serve classify: serve a *ForSequenceClassification model of "
                            "several labels, or one of one label with --task classify.", param="model",
                       code="unsupported_model")
    if chat:  # one input: the conversation as the chat template writes it
        prompts = await input_prompts(state, req, [await render_messages(state, req)], "messages")
    else:
        prompts = await input_prompts(state, req)
    return req, pooling(state, req, prompts, prefix)
