"""llama.cpp's native requests: `POST /completion` (a prompt, as llama.cpp's own clients and UIs send it) and the
sampling fields it shares with `POST /infill` (asgi/requests/infill_request.py), in llama.cpp's names, mapped onto a
completion request (`n_predict` -1: until the model stops or the context is full). Fields this server does not read
(`cache_prompt`, `samplers`, `id_slot`, `t_max_predict_ms`, ...) are ignored, as llama.cpp ignores what it does not
know. `n_probs` gives each token's logprob and the top n (`completion_probabilities`); `post_sampling_probs` is
refused (a 400 naming it): the probabilities are the model's, before sampling.
"""
from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from rill.asgi.errors import unsupported
from rill.asgi.requests.bounds import MAX_CONSTRAINT_LEN, MAX_STOP, LogprobsCount, StopString
from rill.asgi.requests.cache_salt import CacheSalt
from rill.asgi.requests.priority import Priority
from rill.asgi.requests.schemas import INT64_MAX, INT64_MIN, CompletionRequest, Penalty


class LlamaSampling(msgspec.Struct, kw_only=True):
    model: str | None = None
    n_predict: Annotated[int, Meta(ge=-1, le=INT64_MAX)] = -1
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_k: Annotated[int, Meta(ge=-1, le=INT64_MAX)] | None = None
    top_p: Annotated[float, Meta(gt=0, le=1)] | None = None
    min_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    repeat_penalty: Annotated[float, Meta(gt=0, le=2)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    seed: Annotated[int, Meta(ge=INT64_MIN, le=INT64_MAX)] | None = None
    stop: Annotated[list[StopString], Meta(max_length=MAX_STOP)] | None = None
    ignore_eos: bool = False
    stream: bool = False
    json_schema: Any = None  # the output follows this JSON schema (asgi/requests/structured.py checks it)
    grammar: Annotated[str, Meta(max_length=MAX_CONSTRAINT_LEN)] | None = None  # GBNF, as xgrammar reads it
    n_probs: LogprobsCount = 0  # at most --max-logprobs (sampling.py)
    post_sampling_probs: bool = False
    return_tokens: bool = False  # each piece's token ids in `tokens`
    cache_salt: CacheSalt | None = None  # vLLM's: a namespace of its own in the prefix cache (asgi/requests/cache_salt.py)
    priority: Priority = 0  # vLLM's, under --scheduling-policy priority (asgi/requests/priority.py)


class LlamaCompletionRequest(LlamaSampling, kw_only=True):
    prompt: str | Annotated[list[Annotated[int, Meta(ge=0, le=INT64_MAX)]], Meta(min_length=1)]


completion_decoder = msgspec.json.Decoder(LlamaCompletionRequest)
# A completion's fields as llama.cpp names them, for the 400s of the checks they share
LLAMA_NAMES = {"guided_json": "json_schema", "guided_grammar": "grammar", "repetition_penalty": "repeat_penalty",
               "max_tokens": "n_predict", "logprobs": "n_probs"}


def as_completion(req: LlamaSampling, model: str, prompt_ids: list[int], max_tokens: int) -> CompletionRequest:
    """The completion request it runs as (its sampling fields checked as completions' are)."""
    if req.post_sampling_probs:
        raise unsupported("post_sampling_probs")
    return CompletionRequest(model=model, prompt=prompt_ids, max_tokens=max_tokens, temperature=req.temperature,
                             top_k=req.top_k if req.top_k not in (0, None) else None, top_p=req.top_p,
                             min_p=req.min_p, repetition_penalty=req.repeat_penalty,
                             presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
                             seed=req.seed if req.seed not in (-1, None) else None, stop=req.stop,
                             ignore_eos=req.ignore_eos, stream=req.stream, guided_json=req.json_schema,
                             guided_grammar=req.grammar)
