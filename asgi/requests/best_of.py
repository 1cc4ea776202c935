"""OpenAI's legacy `best_of` for completions: how many candidates a prompt (asgi/engine_link/best_of.py chooses)."""
from __future__ import annotations

from rill.asgi.errors import APIError
from rill.asgi.requests.schemas import CompletionRequest

MAX_BEST_OF = 20  # OpenAI's bound


def candidates_per_prompt(req: CompletionRequest) -> int:
    """`best_of`, checked (at least `n`, not streamed, not with a beam search); `n` where not asked."""
    n = req.n or 1
    if req.best_of is None or req.best_of == n:
        return n
    if req.best_of < n:
        raise APIError(400, f"`best_of` ({req.best_of}) must be at least `n` ({n}).", param="best_of")
    if req.stream:
        raise APIError(400, "`best_of` cannot be streamed: the best are known once every candidate is whole.",
                       param="best_of")
    if req.use_beam_search:
        raise APIError(400, "`best_of` cannot be combined with `use_beam_search` (whose `n` is its width).",
                       param="best_of")
    return req.best_of
