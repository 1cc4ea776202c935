"""The `input` of an embeddings or classify request (a string, strings, token ids, or lists of them) as the
engine requests that pool it: tokenized, cut by `truncate_prompt_tokens`, each within the context."""
from __future__ import annotations

import msgspec

from rill.asgi.engine_link.generate import Generation, new_request_id
from rill.asgi.errors import APIError
from rill.asgi.prompt.encoding import tokenize_prompts
from rill.asgi.prompt.truncation import truncated_prompts
from rill.asgi.requests.priority import request_priority
from rill.asgi.requests.schemas import prompt_batch
from rill.ipc.protocol import SamplingParams

POOL = SamplingParams(max_tokens=1, temperature=0.0, embed=True)  # the runner's "embedding" is the answer


async def input_prompts(state, req, batch: list[str] | list[list[int]] | None = None,
                        param: str | None = None) -> list[list[int]]:
    """`req.input`'s prompts (or `batch`, its inputs already listed), each a 400 naming it past the context
    (`input[i]`, or `param`: the field the one prompt came from)."""
    limits = state.settings.limits
    batch = prompt_batch(req.input, "input") if batch is None else batch  # at most MAX_PROMPTS inputs
    specials = req.add_special_tokens
    prompts = await tokenize_prompts(state.tokenizer, batch, limits.vocab_size, "input", add_special_tokens=specials)
    prompts = truncated_prompts(state.tokenizer, batch, prompts, req.truncate_prompt_tokens, limits.max_model_len,
                                specials)
    for i, ids in enumerate(prompts):
        if len(ids) > limits.max_model_len:
            where = param or f"input[{i}]"
            raise APIError(400, f"`{where}` has {len(ids)} tokens; this model takes at most "
                                f"{limits.max_model_len}.", param=where, code="context_length_exceeded")
    return prompts


def pooling(state, req, prompts: list[list[int]], prefix: str) -> Generation:
    """One engine request per prompt, pooled instead of sampled, at the request's priority."""
    priority = request_priority(req.priority, state.settings.limits)
    params = msgspec.structs.replace(POOL, priority=priority) if priority else POOL
    make_detok = state.detokenizer(stop=[], skip_special_tokens=True, include_stop=False)
    return Generation(state.client, new_request_id(prefix), prompts, params, make_detok)
