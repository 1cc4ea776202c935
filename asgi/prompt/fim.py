"""Fill-in-the-middle prompts: `suffix` on /v1/completions, in the served model's own FIM tokens.

A code model trained for it completes the middle between a prefix (the prompt) and a suffix when its prompt is
laid out with its special tokens, which the tokenizer names:

    <fim_prefix>PREFIX<fim_suffix>SUFFIX<fim_middle>            StarCoder, SmolLM, Granite code, Refact
    <|fim_prefix|>PREFIX<|fim_suffix|>SUFFIX<|fim_middle|>      Qwen2.5-Coder, Qwen3-Coder
    <｜fim▁begin｜>PREFIX<｜fim▁hole｜>SUFFIX<｜fim▁end｜>          DeepSeek-Coder
    ▁<PRE>PREFIX▁<SUF>SUFFIX▁<MID>                              Code Llama
    [SUFFIX]SUFFIX[PREFIX]PREFIX                                Codestral (suffix first; no middle token)

The first family whose three tokens (two for suffix-first) the tokenizer holds, below the model's vocabulary
size, is the model's; none: a 400 naming `suffix` (asgi/routes/completions.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Tokenizer

from rill.asgi.errors import APIError
from rill.asgi.prompt.encoding import encode_texts, tokenize_prompts

# (prefix, suffix, middle) token names; middle None: suffix first (Codestral)
FAMILIES: list[tuple[str, str, str | None]] = [
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
    ("▁<PRE>", "▁<SUF>", "▁<MID>"),
    ("[PREFIX]", "[SUFFIX]", None),
]


# Repository-level context (llama.cpp's /infill `input_extra`): the repository's name, and each file's.
REPO_NAMES = ("<repo_name>", "<|repo_name|>")
FILE_SEPARATORS = ("<file_sep>", "<|file_sep|>")


@dataclass(frozen=True)
class FimTokens:
    prefix: int
    suffix: int
    middle: int | None  # None: the suffix goes first, then the prefix, which the output continues
    repo_name: int | None = None
    file_sep: int | None = None
    opening: tuple[int, ...] = ()  # what the tokenizer opens every text with (a BOS), a text prompt's start

    def layout(self, prefix: list[int], suffix: list[int]) -> list[int]:
        if self.middle is None:
            return [self.suffix, *suffix, self.prefix, *prefix]
        return [self.prefix, *prefix, self.suffix, *suffix, self.middle]


def fim_tokens(tokenizer: Tokenizer, vocab_size: int) -> FimTokens | None:
    """The served model's FIM tokens, or None where its tokenizer has none."""
    for names in FAMILIES:
        ids = [None if name is None else tokenizer.token_to_id(name) for name in names]
        if all(i is not None and i < vocab_size for i in ids[:2]) and (names[2] is None or
                                                                      (ids[2] is not None and ids[2] < vocab_size)):
            return FimTokens(*ids, repo_name=_first(tokenizer, REPO_NAMES, vocab_size),
                             file_sep=_first(tokenizer, FILE_SEPARATORS, vocab_size),
                             opening=tuple(tokenizer.encode("", add_special_tokens=True).ids))
    return None


def _first(tokenizer: Tokenizer, names: tuple[str, ...], vocab_size: int) -> int | None:
    return next((i for name in names if (i := tokenizer.token_to_id(name)) is not None and i < vocab_size), None)


async def fim_prompts(tokenizer: Tokenizer, fim: FimTokens | None, prompts: list[str] | list[list[int]],
                      suffix: str, vocab_size: int) -> list[list[int]]:
    """Each prompt (text, or token ids as sent) as the prefix before `suffix`, laid out in the model's FIM tokens.
    A text prompt gets what the tokenizer opens every text with (a BOS), as a plain one does. An empty prefix
    is fine (the cursor at the top of a file)."""
    if fim is None:
        raise APIError(400, "`suffix` needs a model trained for fill-in-the-middle: the served model's tokenizer "
                            "has no FIM tokens (<fim_prefix>, <|fim_prefix|>, ...).", param="suffix")
    suffix_ids, *texts = await encode_texts(tokenizer, [suffix, *(p for p in prompts if isinstance(p, str))],
                                            add_special_tokens=False)
    if prompts and isinstance(prompts[0], str):
        return [[*fim.opening, *fim.layout(ids, suffix_ids)] for ids in texts]
    prompts = await tokenize_prompts(tokenizer, prompts, vocab_size, "prompt")  # the ids checked
    return [fim.layout(list(ids), suffix_ids) for ids in prompts]
