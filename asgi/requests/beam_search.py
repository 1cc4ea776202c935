"""vLLM's beam search for chat and completions: `use_beam_search` with `n` beams (the width, and the choices
answered), `length_penalty` and `early_stopping`, checked here and run by asgi/engine_link/beam_generation.py.

A beam search reads the model's own logprobs, so what would change them or cut the text is refused with a
400 naming it (vLLM ignores most of these silently): stop strings, biases, penalties, bad and allowed words,
structured outputs, thinking budgets, predicted outputs, prompt logprobs. The sampling options (temperature,
top_p, top_k, min_p, seed) do not apply to a search and are ignored, as transformers' beam search ignores them.
"""
from __future__ import annotations

from collections.abc import Callable

from rill.asgi.engine_link.beam_generation import BeamGeneration
from rill.asgi.engine_link.beams import BeamSet
from rill.asgi.errors import APIError
from rill.asgi.output.detokenizer import Detokenizer
from rill.asgi.requests.schemas import ChatCompletionRequest, SamplingFields
from rill.asgi.requests.structured import CONSTRAINT_FIELDS
from rill.asgi.state import WorkerState
from rill.ipc.protocol import SamplingParams

# Every step sends each beam's whole sequence to the engine again (the prefix cache spares its compute, not its
# bytes): beams in all, prompts x n, are bounded so that one request's steps cannot crowd an API worker's loop.
MAX_BEAMS = 64


def _refused(req: SamplingFields, params: SamplingParams) -> str | None:
    """The first field of the request a beam search cannot honour, or None."""
    chat = isinstance(req, ChatCompletionRequest)
    uses = [
        ("stop", bool(req.stop)),
        ("logit_bias", bool(req.logit_bias)),
        ("presence_penalty", bool(req.presence_penalty)),
        ("frequency_penalty", bool(req.frequency_penalty)),
        ("repetition_penalty", req.repetition_penalty not in (None, 1.0)),
        ("bad_words", bool(req.bad_words)),
        ("allowed_token_ids", bool(req.allowed_token_ids)),
        ("prompt_logprobs", req.prompt_logprobs is not None),
        ("echo", not chat and params.prompt_logprobs is not None),  # completions' echo with logprobs scores the prompt
        (_constraint(req), params.structured is not None),
        ("thinking_token_budget", params.thinking is not None),
        ("prediction", chat and req.prediction is not None),
        ("nvext", req.nvext is not None),
    ]
    return next((name for name, used in uses if used), None)


def _constraint(req: SamplingFields) -> str:
    """The field that holds a request's structured output: one of its constraint fields, else a forced tool call."""
    return next((name for name in CONSTRAINT_FIELDS if getattr(req, name) not in (None, {"type": "text"})),
                "tool_choice")


def beam_search(state: WorkerState, req: SamplingFields, params: SamplingParams, prompts: list[list[int]],
                make_detokenizer: Callable[[], Detokenizer], request_id: str) -> BeamGeneration | None:
    """The request's beam search, or None when it asks for none."""
    if not req.use_beam_search:
        return None
    if (name := _refused(req, params)) is not None:
        raise APIError(400, f"`{name}` cannot be combined with `use_beam_search`: a beam search ranks the model's "
                            "own logprobs.", param=name)
    limits = state.settings.limits
    width = req.n or 1
    if len(prompts) * width > MAX_BEAMS:
        raise APIError(400, f"A beam search takes at most {MAX_BEAMS} beams in all (prompts x n); this one asks for "
                            f"{len(prompts) * width}.", param="n" if len(prompts) == 1 else "prompt")
    end_ids = frozenset() if params.ignore_eos else frozenset(limits.eos_token_ids) | frozenset(params.stop_token_ids)
    top = BeamSet.top_k(width, len(end_ids))
    most = state.settings.http.max_logprobs
    most = limits.vocab_size if most < 0 else min(most, limits.vocab_size)
    if top > most:
        raise APIError(400, f"A beam search of n={width} beams reads each beam's top {top} logprobs a step; this "
                            f"server gives at most {most} (--max-logprobs).", param="n")
    return BeamGeneration(state.client, request_id, prompts, params, make_detokenizer, width=width, end_ids=end_ids,
                          length_penalty=req.length_penalty, early_stopping=req.early_stopping,
                          timeout_s=limits.request_timeout_s, cache_salt=req.cache_salt,
                          return_token_ids=bool(req.return_token_ids))
