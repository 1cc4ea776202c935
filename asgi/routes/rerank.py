"""POST /v1/rerank, /rerank, /v2/rerank (Jina's and Cohere's shapes, as vLLM serves them) and
POST /score, /v1/score (vLLM's): each (query, document) pair is one engine request that a
cross-encoder or a yes/no decoder reranker scores instead of sampling, batched by the engine like embeddings."""
from __future__ import annotations

from rill.asgi.engine_link.generate import Generation, new_request_id
from rill.asgi.errors import APIError, unsupported
from rill.asgi.http.router import HTTPRequest
from rill.asgi.output.respond import Shape, respond
from rill.asgi.output.score_format import RerankList, ScoreList
from rill.asgi.prompt.pairs import encode_judged_pairs, encode_pairs
from rill.asgi.prompt.truncation import truncation_size
from rill.asgi.requests.body import decode_json
from rill.asgi.requests.model_choice import resolve_model
from rill.asgi.requests.rerank_request import (
    RerankRequest,
    ScoreRequest,
    rerank_decoder,
    rerank_pairs,
    score_decoder,
    score_pairs,
    use_activation,
)
from rill.asgi.state import WorkerState
from rill.ipc.protocol import SamplingParams

SCORE = SamplingParams(max_tokens=1, temperature=0.0, embed=True)  # the runner's "embedding" is the score


async def rerank(http: HTTPRequest) -> None:
    state: WorkerState = http.state
    req = decode_json(rerank_decoder, http.body)
    await _check_serves_scores(state, req.model)
    queries, texts = rerank_pairs(req)
    prompts = await _prompts(state, req, queries, texts, "query", "documents", req.max_tokens_per_doc)
    shape = RerankList(state.model_id, use_activation(req), texts if req.return_documents else None, req.top_n or 0)
    await _run(http, "rerank", prompts, shape)


async def score(http: HTTPRequest) -> None:
    state: WorkerState = http.state
    req = decode_json(score_decoder, http.body)
    await _check_serves_scores(state, req.model)
    firsts, seconds = score_pairs(req)
    prompts = await _prompts(state, req, firsts, seconds, "text_1", "text_2")
    await _run(http, "score", prompts, ScoreList(state.model_id, use_activation(req)))


async def _check_serves_scores(state: WorkerState, model: str | None) -> None:
    await resolve_model(state, model, adapters=False)
    if state.settings.limits.scorer not in ("cross-encoder", "yes-no"):
        raise APIError(400, "This server does not serve rerank or score: serve a cross-encoder (a sentence-transformers "
                            "CrossEncoder, or a *ForSequenceClassification model with one label), or a decoder "
                            "reranker with --task score.", param="model", code="unsupported_model")


async def _prompts(state: WorkerState, req: RerankRequest | ScoreRequest, firsts: list[str], seconds: list[str],
                   first_param: str, second_param: str, second_max: int | None = None) -> list[list[int]]:
    """`second_max`: Cohere's max_tokens_per_doc."""
    max_model_len = state.settings.limits.max_model_len
    size = truncation_size(req.truncate_prompt_tokens, max_model_len)
    if state.settings.limits.scorer == "yes-no":
        return await encode_judged_pairs(state.tokenizer, firsts, seconds, req.instruction,
                                         max_model_len=max_model_len, first_param=first_param,
                                         second_param=second_param, truncate_to=size, second_max=second_max)
    if req.instruction is not None:  # a cross-encoder reads the pair alone
        raise unsupported("instruction")
    return await encode_pairs(state.tokenizer, state.pair_separator, firsts, seconds, max_model_len=max_model_len,
                              first_param=first_param, second_param=second_param, truncate_to=size,
                              second_max=second_max)


async def _run(http: HTTPRequest, prefix: str, prompts: list[list[int]], shape: Shape) -> None:
    state: WorkerState = http.state
    make_detok = state.detokenizer(stop=[], skip_special_tokens=True, include_stop=False)
    gen = Generation(state.client, new_request_id(prefix), prompts, SCORE, make_detok)
    await respond(gen, shape, stream=False, receive=http.receive, send=http.send,
                  keepalive_s=state.settings.http.sse_keepalive_s)
