"""vLLM's `truncate_prompt_tokens` on chat, completions and embeddings: a prompt's last k tokens only (left
truncation, as vLLM keeps them), so that a client can send a prompt longer than the model takes and keep its end.
A text prompt keeps the special tokens its tokenizer adds around it (a BOS; an encoder's [CLS] and [SEP], which
its pooling reads), as a Hugging Face tokenizer's own truncation does for vLLM; token ids and a chat template's
text are cut as they are."""
from __future__ import annotations

import functools

from tokenizers import Tokenizer

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


@functools.lru_cache(maxsize=8)
def added_specials(tokenizer: Tokenizer) -> tuple[int, int]:
    """How many special tokens the tokenizer puts before and after a text it encodes."""
    plain = tokenizer.encode("a", add_special_tokens=False).ids
    full = tokenizer.encode("a", add_special_tokens=True).ids
    for start in range(len(full) - len(plain) + 1):
        if full[start:start + len(plain)] == plain:
            return start, len(full) - start - len(plain)
    return 0, 0


def truncate(prompts: list[list[int]], k: int | None, max_model_len: int,
             keep: tuple[int, int] = (0, 0)) -> list[list[int]]:
    """Each prompt's last `truncation_size` tokens, the first keep[0] and last keep[1] kept whole (the
    tokenizer's specials, added_specials); the prompts themselves where none is asked or none is longer."""
    size = truncation_size(k, max_model_len)
    if size is None or all(len(ids) <= size for ids in prompts):
        return prompts
    before, after = keep
    if size <= before + after:
        raise APIError(400, f"`{PARAM}` is {k}; the tokenizer adds {before + after} special tokens to each prompt, "
                            "so keep more than that.", param=PARAM)
    return [ids if len(ids) <= size else ids[:before] + ids[before:len(ids) - after][-(size - before - after):]
            + ids[len(ids) - after:] for ids in prompts]


def truncated_prompts(tokenizer: Tokenizer, batch: list, prompts: list[list[int]], k: int | None,
                      max_model_len: int, specials: bool = True) -> list[list[int]]:
    """`prompts` (tokenize_prompts' of `batch`: texts or token ids; `specials`: with the tokenizer's special
    tokens added) truncated as the request asks."""
    texts = isinstance(batch[0], str) and specials
    return truncate(prompts, k, max_model_len, added_specials(tokenizer) if texts and k is not None else (0, 0))
