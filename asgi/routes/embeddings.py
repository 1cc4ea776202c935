"""POST /v1/embeddings: each input is an engine request that pools its prompt instead of sampling.

The engine batches them with the other requests of a step (chunked like any prompt); the
vectors come back as float32 bytes with each input's last delta.
"""
from __future__ import annotations

import base64
from typing import Any

import msgspec
import numpy as np

from rill.asgi.engine_link.generate import ChoiceDelta, Generation, GenerationFailed
from rill.asgi.errors import APIError
from rill.asgi.http.router import HTTPRequest
from rill.asgi.output.respond import respond
from rill.asgi.prompt.inputs import input_prompts, pooling
from rill.asgi.requests.body import decode_json
from rill.asgi.requests.embeddings_request import MAX_INPUTS, EmbeddingsRequest, embeddings_decoder
from rill.asgi.requests.model_choice import resolve_model
from rill.asgi.requests.schemas import prompt_batch
from rill.asgi.state import WorkerState


class EmbeddingList:
    """The Shape (asgi/output/respond.py) of an embeddings answer: one body, never a stream."""

    ends_with_done = False
    opens_with_first_token = False

    def __init__(self, model: str, base64_format: bool) -> None:
        self.model = model
        self.base64_format = base64_format

    def add(self, deltas: list[ChoiceDelta]) -> None:
        pass  # the vectors wait in the mailbox until the body is made

    def body(self, gen: Generation) -> bytes | None:
        if gen.disconnected:
            return None
        data = []
        for i, choice in enumerate(gen.mailbox.choices):
            if choice.embedding is None:
                raise GenerationFailed("The engine returned no embedding.")
            vector = base64.b64encode(choice.embedding).decode() if self.base64_format else \
                np.frombuffer(choice.embedding, dtype="<f4").tolist()
            data.append({"object": "embedding", "index": i, "embedding": vector})
        tokens = gen.usage().prompt_tokens
        return msgspec.json.encode({"object": "list", "data": data, "model": self.model,
                                    "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


class LlamaEmbeddings(EmbeddingList):
    """llama.cpp's POST /embedding answer: `[{"index": i, "embedding": [vector]}]` (a pooled input's one vector)."""

    def body(self, gen: Generation) -> bytes | None:
        if gen.disconnected:
            return None
        if any(choice.embedding is None for choice in gen.mailbox.choices):
            raise GenerationFailed("The engine returned no embedding.")
        return msgspec.json.encode([{"index": i, "embedding": [np.frombuffer(choice.embedding, dtype="<f4").tolist()]}
                                    for i, choice in enumerate(gen.mailbox.choices)])


class LlamaEmbeddingRequest(msgspec.Struct, kw_only=True):
    content: str | list[Any]  # llama.cpp's: a text, texts, token ids or lists of them
    model: str | None = None


llama_embedding_decoder = msgspec.json.Decoder(LlamaEmbeddingRequest)


async def create_embeddings(http: HTTPRequest) -> None:
    state: WorkerState = http.state
    req: EmbeddingsRequest = decode_json(embeddings_decoder, http.body)
    gen = await embedding_generation(state, req)
    await respond(gen, EmbeddingList(state.model_id, req.encoding_format == "base64"), stream=False,
                  receive=http.receive, send=http.send, keepalive_s=state.settings.http.sse_keepalive_s)


async def llama_embedding(http: HTTPRequest) -> None:
    """llama.cpp's POST /embedding: `content` as /v1/embeddings' `input` (its checks and 400s naming `input`)."""
    state: WorkerState = http.state
    req = decode_json(llama_embedding_decoder, http.body)
    gen = await embedding_generation(state, EmbeddingsRequest(model=req.model or state.model_id, input=req.content))
    await respond(gen, LlamaEmbeddings(state.model_id, False), stream=False, receive=http.receive, send=http.send,
                  keepalive_s=state.settings.http.sse_keepalive_s)


async def embedding_generation(state: WorkerState, req: EmbeddingsRequest) -> Generation:
    """The engine requests of an embeddings request, once its model and inputs are checked."""
    await resolve_model(state, req.model, adapters=False)  # the served model's embeddings only
    limits = state.settings.limits
    if limits.scorer:
        what, use = ("a classifier", "POST /classify") if limits.scorer == "classify" else \
            (f"a reranker ({limits.scorer})", "POST /v1/rerank or /score")
        raise APIError(400, f"This server serves {what}, which makes no embeddings; use {use}.", param="model",
                       code="unsupported_model")
    if not limits.embedding_dim:
        raise APIError(400, "This server does not serve embeddings: start it with --enable-embeddings, or serve "
                            "an embedding model.", param="model", code="unsupported_model")
    if req.dimensions is not None and req.dimensions != limits.embedding_dim:
        raise APIError(400, f"This model's embeddings have {limits.embedding_dim} dimensions and cannot be "
                            "shortened (it is not a Matryoshka model).", param="dimensions")
    batch = prompt_batch(req.input, "input")
    if any(isinstance(text, str) and not text for text in batch):  # an encoder's [CLS] [SEP] would embed it
        raise APIError(400, "`input` must not hold an empty string.", param="input")
    if len(batch) > MAX_INPUTS:
        raise APIError(400, f"`input` holds {len(batch)} inputs; at most {MAX_INPUTS} per request.", param="input")
    return pooling(state, req, await input_prompts(state, req, batch), "embd")
