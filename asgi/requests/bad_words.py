"""vLLM's `bad_words`: words a choice may never write, as token id sequences for the engine's sampler
(engine_proc/sample/bad_words.py). As vLLM tokenizes them: each word as given (leading spaces stripped) and with
one space before it, the second kept where the space makes other tokens of the same count (" word" is often one
token of its own where "word" is not)."""
from __future__ import annotations

from tokenizers import Tokenizer

from rill.asgi.errors import APIError

MAX_BAD_WORD_TOKENS = 64  # compared with the end of the output at every step


def bad_words_ids(tokenizer: Tokenizer, words: list[str] | None) -> list[list[int]]:
    out: list[list[int]] = []
    for i, word in enumerate(words or []):
        bare = tokenizer.encode(word.lstrip(), add_special_tokens=False).ids
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False).ids
        if not bare:
            raise APIError(400, f"`bad_words[{i}]` has no tokens.", param=f"bad_words[{i}]")
        if len(spaced) > MAX_BAD_WORD_TOKENS:
            raise APIError(400, f"`bad_words[{i}]` has {len(spaced)} tokens; at most {MAX_BAD_WORD_TOKENS}.",
                           param=f"bad_words[{i}]")
        out.append(bare)
        if spaced[0] != bare[0] and len(spaced) == len(bare):
            out.append(spaced)
    return out
