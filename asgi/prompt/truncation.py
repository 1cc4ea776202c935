"""vLLM's `truncate_prompt_tokens` on chat and completions: a prompt's last k tokens only (left truncation, as
vLLM keeps them), so that a client can send a prompt longer than the model takes and keep its end."""
from __future__ import annotations

from rill.asgi.errors import APIError

PARAM = "truncate_prompt_tokens"


def truncation_size(k: int | None, max_model_len: int) -> int | None:
    """How many tokens a prompt keeps: None (all), k, or the model's context length for -1 (vLLM's)."""
    if k is None:
        return None
    if k == 0:
        raise APIError(400, f"`{PARAM}` must be -1 (the model's context length) or at least 1.", param=PARAM)
    if k == -1:
        return max_model_len
    if k > max_model_len:
        raise APIError(400, f"`{PARAM}` is {k}; this model's context length is {max_model_len}: ask for at most "
                            "that.", param=PARAM)
    return k


def truncate(prompts: list[list[int]], k: int | None, max_model_len: int) -> list[list[int]]:
    """Each prompt's last `truncation_size` tokens (the prompts themselves where none is asked)."""
    size = truncation_size(k, max_model_len)
    return prompts if size is None else [ids[-size:] for ids in prompts]
