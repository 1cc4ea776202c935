"""Turn a validated request into the engine's SamplingParams, checking the context length."""
from __future__ import annotations

import re

from tokenizers import Tokenizer

from rill.asgi.errors import APIError
from rill.asgi.requests.bad_words import bad_words_ids
from rill.asgi.requests.schemas import SamplingFields
from rill.asgi.requests.structured import structured_spec
from rill.ipc.protocol import SamplingParams


def sampling_params(req: SamplingFields, *, max_tokens: int | None, prompt_len: int,
                    max_model_len: int, prompt_param: str, vocab_size: int,
                    logprobs: int | None = None, max_tokens_param: str = "max_tokens",
                    prompt_logprobs: int | None = None, defaults: dict | None = None,
                    tokenizer: Tokenizer | None = None, max_logprobs: int = 20,
                    logprobs_param: str = "logprobs") -> SamplingParams:
    """`logprobs`: how many top logprobs per token the engine returns (None: no logprobs);
    `prompt_logprobs`: the same for the prompt's tokens; both at most `max_logprobs` (--max-logprobs,
    -1 the vocabulary); `defaults`: the model's sampling defaults for the fields the request leaves
    out (asgi/requests/sampling_defaults.py); `tokenizer`: for `bad_words`. `prompt_param`,
    `max_tokens_param` and `logprobs_param`: the names the caller's API gives the prompt, the output
    limit and the top logprobs (`input`, `max_output_tokens` and `top_logprobs` in the Responses
    API), for its errors."""
    most = vocab_size if max_logprobs < 0 else min(max_logprobs, vocab_size)
    for count, param in ((logprobs, logprobs_param), (prompt_logprobs, "prompt_logprobs")):
        if count is not None and count > most:
            raise APIError(400, f"`{param}` asks for {count} top logprobs a token; this server gives at most {most} "
                                "(--max-logprobs).", param=param)
    room = max_model_len - prompt_len
    if room <= 0 or (max_tokens is not None and max_tokens > room):
        wanted = f"{prompt_len} tokens in the prompt" + (f" and {max_tokens} to generate" if max_tokens else "")
        raise APIError(
            400,
            f"This model's maximum context length is {max_model_len} tokens; the request asks for "
            f"{wanted}. Shorten the prompt or lower {max_tokens_param}.",
            param=prompt_param if max_tokens is None or prompt_len >= max_model_len else max_tokens_param,
            code="context_length_exceeded",
        )
    if max_tokens is not None and req.min_tokens > max_tokens:
        # vLLM refuses this too: the request could never be honoured.
        raise APIError(400, f"`min_tokens` ({req.min_tokens}) must not exceed `{max_tokens_param}` ({max_tokens}).",
                       param="min_tokens")
    model = defaults or {}
    pick = lambda name, rill_default: (model.get(name, rill_default) if getattr(req, name) is None  # noqa: E731
                                       else getattr(req, name))
    params = SamplingParams(
        max_tokens=max_tokens if max_tokens is not None else room,
        temperature=pick("temperature", 1.0),
        top_p=pick("top_p", 1.0),
        top_k=max(pick("top_k", 0), 0),  # -1 and 0 both mean "off", as in vLLM
        seed=req.seed,
        min_tokens=req.min_tokens,
        ignore_eos=req.ignore_eos,
        stop_token_ids=req.stop_token_ids or [],
        min_p=pick("min_p", 0.0),
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=pick("repetition_penalty", 1.0),
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        logit_bias=logit_bias(req.logit_bias, vocab_size),
        allowed_token_ids=allowed_token_ids(req.allowed_token_ids, vocab_size),
        bad_words_ids=bad_words_ids(tokenizer, req.bad_words) if req.bad_words else [],
        structured=structured_spec(req),
    )
    return req.nvext.apply(params) if req.nvext is not None else params


def allowed_token_ids(ids: list[int] | None, vocab_size: int) -> list[int]:
    """vLLM's allowed_token_ids, each in this vocabulary; [] when not asked."""
    if not ids:
        return []
    if (top := max(ids)) >= vocab_size:
        raise APIError(400, f"`allowed_token_ids` holds {top}, outside the vocabulary (0 to {vocab_size - 1}).",
                       param="allowed_token_ids")
    return sorted(set(ids))


_TOKEN_ID = re.compile(r"-?[0-9]{1,19}")  # a negative id is refused below, by range


def logit_bias(bias: dict[str, float] | None, vocab_size: int) -> dict[int, float]:
    """OpenAI's string keys as token ids of this vocabulary; values are range-checked by msgspec."""
    out: dict[int, float] = {}
    for key, value in (bias or {}).items():
        # int() would also take " 5" and "1_0", and refuse 4,301 digits with a ValueError.
        if not _TOKEN_ID.fullmatch(key):
            raise APIError(400, f"`logit_bias` keys must be token ids; got {key[:50]!r}.", param="logit_bias")
        token_id = int(key)
        if not 0 <= token_id < vocab_size:
            raise APIError(400, f"`logit_bias` token id {token_id} is outside the vocabulary "
                                f"(0 to {vocab_size - 1}).", param="logit_bias")
        out[token_id] = value
    return out
