"""Tokenizing prompts without stalling a worker's event loop: large ones go to a thread."""
from __future__ import annotations

import asyncio

from tokenizers import Tokenizer

from rill.asgi.errors import APIError

# A 64 KiB prompt encodes in about 30 ms here: below that, the encode stays on the loop (a thread
# hop would cost more than the stall); above it, it runs on a thread. `tokenizers` releases the
# GIL in encode_batch, so the loop keeps serving this worker's other requests meanwhile (a 10 MB
# prompt held it for 5 to 8 s before).
OFF_LOOP_CHARS = 64 * 1024


async def encode_texts(tokenizer: Tokenizer, texts: list[str], *, add_special_tokens: bool) -> list[list[int]]:
    if sum(map(len, texts)) < OFF_LOOP_CHARS:
        encodings = tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)
    else:
        encodings = await asyncio.to_thread(tokenizer.encode_batch, texts, add_special_tokens=add_special_tokens)
    return [e.ids for e in encodings]


async def tokenize_prompts(tokenizer: Tokenizer, prompts: list[str] | list[list[int]], vocab_size: int,
                           param: str, add_special_tokens: bool = True) -> list[list[int]]:
    """A batch of prompts (texts, or token-id lists checked against the vocabulary) as token ids;
    a 400 names `param` (completions' `prompt`, embeddings' `input`). `add_special_tokens`: the tokenizer's
    own around each text (a BOS; [CLS] and [SEP]), vLLM's request field of that name."""
    if isinstance(prompts[0], str):
        prompts = await encode_texts(tokenizer, prompts, add_special_tokens=add_special_tokens)
        if not all(prompts):
            raise APIError(400, f"`{param}` must not be empty.", param=param)
        return prompts
    for i, ids in enumerate(prompts):
        if any(t < 0 or t >= vocab_size for t in ids):
            raise APIError(400, f"Token ids must be between 0 and {vocab_size - 1}.", param=f"{param}[{i}]")
    return prompts
