"""Encoding (query, document) pairs for a cross-encoder with the tokenizer's own pair template
(`[CLS] q [SEP] d [SEP]`), each pair one prompt, checked before the engine sees it."""
from __future__ import annotations

import asyncio

from tokenizers import Encoding, Tokenizer

from rill.asgi.errors import APIError
from rill.asgi.prompt.encoding import OFF_LOOP_CHARS
from rill.ipc.pair_segments import follows_the_rule


async def encode_pairs(tokenizer: Tokenizer, separator: int | None, firsts: list[str], seconds: list[str], *,
                       max_model_len: int, first_param: str, second_param: str) -> list[list[int]]:
    """One prompt per pair. A 400 names `second_param[i]` for a pair longer than `max_model_len` (never
    cut short), and `first_param` (with `[i]` where several) for a first text the engine would split
    wrongly: one that holds the separator token's text (ipc/pair_segments.py)."""
    pairs = list(zip(firsts, seconds))
    if sum(len(a) + len(b) for a, b in pairs) < OFF_LOOP_CHARS:
        encodings = tokenizer.encode_batch(pairs, add_special_tokens=True)
    else:
        encodings = await asyncio.to_thread(tokenizer.encode_batch, pairs, add_special_tokens=True)
    one_first = len(set(firsts)) == 1
    for i, enc in enumerate(encodings):
        _check(enc, i, separator, max_model_len, first_param if one_first else f"{first_param}[{i}]",
               f"{second_param}[{i}]")
    return [enc.ids for enc in encodings]


def _check(enc: Encoding, i: int, separator: int | None, max_model_len: int, first: str, second: str) -> None:
    if len(enc.ids) > max_model_len:
        raise APIError(400, f"Pair {i} (`{first}` with `{second}`) has {len(enc.ids)} tokens; this model takes at "
                            f"most {max_model_len}.", param=second, code="context_length_exceeded")
    if not follows_the_rule(enc.ids, enc.type_ids, separator):
        raise APIError(400, f"`{first}` holds the model's separator token; remove it.", param=first)
