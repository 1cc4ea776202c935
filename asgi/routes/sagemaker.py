"""Amazon SageMaker's two routes, as vLLM serves them: `/ping` (GET or POST), the container's health probe, and
`POST /invocations`, which SageMaker's InvokeEndpoint forwards every request body to.

/ping answers as /ready does (200 while serving, 503 while draining or with the engine gone) and, like it, needs no
API key. /invocations needs one, as every other route does, and runs the body through the route its top-level keys
name, that route's own checks and bounds included: `messages` chat completions (on a server that does not
generate: /classify's chat form for a classifier, else the embeddings'), `prompt` completions, `query` with
`documents` rerank, `text_1` with `text_2` score, `input` embeddings (/classify on a classifier). Anything else is a
400 that lists them. vLLM tries its request types in the same order.
"""
from __future__ import annotations

import msgspec

from rill.asgi.errors import APIError
from rill.asgi.http.router import HTTPRequest

KEYS_HELP = ("`messages` (chat completions), `prompt` (completions), `query` and `documents` (rerank), `text_1` and "
             "`text_2` (score) or `input` (embeddings, or classify on a classifier)")


def top_level_keys(body: bytes) -> set[str]:
    """The keys of a JSON object body; a 400 where the body is not one (the route's own decoding says more)."""
    try:
        return set(msgspec.json.decode(body, type=dict[str, msgspec.Raw]))
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        raise APIError(400, f"The request body is not a JSON object; /invocations takes one with {KEYS_HELP}.",
                       code="invalid_json") from None


def invocations_route(keys: set[str], generates: bool, classifies: bool) -> str:
    """The route a body with `keys` goes to (a path of the router)."""
    if "messages" in keys:
        return "/v1/chat/completions" if generates else "/classify" if classifies else "/v1/embeddings"
    if "prompt" in keys:
        return "/v1/completions"
    if {"query", "documents"} <= keys:
        return "/rerank"
    if {"text_1", "text_2"} <= keys:
        return "/score"
    if "input" in keys:
        return "/classify" if classifies else "/v1/embeddings"
    raise APIError(400, f"/invocations found no route for this body: it takes a JSON object with {KEYS_HELP}.",
                   code="invalid_value")


def make_invocations(handlers: dict[str, object]):
    """POST /invocations over the router's own handlers (`handlers`: path to handler)."""
    async def invocations(http: HTTPRequest) -> None:
        limits = http.state.settings.limits
        path = invocations_route(top_level_keys(http.body), limits.generates, limits.scorer == "classify")
        await handlers[path](http)
    return invocations
