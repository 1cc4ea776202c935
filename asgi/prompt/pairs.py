"""Encoding (query, document) pairs as prompts, each pair one, checked before the engine sees it: for a
cross-encoder with the tokenizer's own pair template (`[CLS] q [SEP] d [SEP]`), for a yes/no decoder
reranker with Qwen3-Reranker's prompt."""
from __future__ import annotations

import asyncio

from tokenizers import Encoding, Tokenizer

from rill.asgi.errors import APIError
from rill.asgi.prompt.encoding import OFF_LOOP_CHARS, encode_texts
from rill.ipc.pair_segments import follows_the_rule

# Qwen3-Reranker's prompt (its model card's, and vLLM's score template qwen3_reranker.jinja): the model
# answers "yes" or "no" after it, and the score is how much it prefers "yes".
JUDGE_PROMPT = ('<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the '
                'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
                "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
                "<|im_start|>assistant\n<think>\n\n</think>\n\n")
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


async def encode_pairs(tokenizer: Tokenizer, separator: int | None, firsts: list[str], seconds: list[str], *,
                       max_model_len: int, first_param: str, second_param: str,
                       truncate_to: int | None = None, second_max: int | None = None) -> list[list[int]]:
    """One prompt per pair. A 400 names `second_param[i]` for a pair longer than `max_model_len` (never
    cut short, unless `truncate_to` or `second_max`: cut_pair()), and `first_param` (with `[i]` where several) for
    a first text the engine would split wrongly: one that holds the separator token's text (ipc/pair_segments.py)."""
    await _check_shared_first(tokenizer, firsts, max_model_len, first_param)
    pairs = list(zip(firsts, seconds))
    encode = (lambda: tokenizer.encode_batch(pairs, add_special_tokens=True)) if truncate_to is None and \
        second_max is None else (lambda: cut_pairs(tokenizer, firsts, seconds, truncate_to, second_max))
    if sum(len(a) + len(b) for a, b in pairs) < OFF_LOOP_CHARS:
        encodings = encode()
    else:
        encodings = await asyncio.to_thread(encode)
    one_first = len(set(firsts)) == 1
    for i, enc in enumerate(encodings):
        _check(enc, i, separator, max_model_len, first_param if one_first else f"{first_param}[{i}]",
               f"{second_param}[{i}]")
    return [enc.ids for enc in encodings]


async def encode_judged_pairs(tokenizer: Tokenizer, firsts: list[str], seconds: list[str], instruction: str | None,
                              *, max_model_len: int, first_param: str, second_param: str,
                              truncate_to: int | None = None, second_max: int | None = None) -> list[list[int]]:
    """One JUDGE_PROMPT per pair (a decoder reranker's). A 400 names `second_param[i]` for a prompt longer than
    `max_model_len` (never cut short, unless `truncate_to`: each document's end cut until its prompt fits;
    `second_max`: each document first cut to that many of its own tokens)."""
    await _check_shared_first(tokenizer, firsts, max_model_len, first_param)
    seconds = list(seconds)  # cut below, the caller's list left as it is
    if second_max is not None:
        for i, enc in enumerate(await asyncio.to_thread(tokenizer.encode_batch, seconds, add_special_tokens=False)):
            if len(enc.ids) > second_max:
                seconds[i] = seconds[i][:enc.offsets[second_max - 1][1]]
    judge = lambda a, b: JUDGE_PROMPT.format(instruction=instruction or DEFAULT_INSTRUCTION, query=a,  # noqa: E731
                                             document=b)
    texts = [judge(a, b) for a, b in zip(firsts, seconds)]
    prompts = await encode_texts(tokenizer, texts, add_special_tokens=False)
    for _ in range(3 if truncate_to is not None else 0):  # the document's end cut by the excess, re-encoded
        over = [i for i, ids in enumerate(prompts) if len(ids) > truncate_to]
        if not over:
            break
        for i in over:
            seconds[i] = cut_text(tokenizer, seconds[i], len(prompts[i]) - truncate_to, second_param, i)
        for i, ids in zip(over, await encode_texts(tokenizer, [judge(firsts[i], seconds[i]) for i in over],
                                                   add_special_tokens=False)):
            prompts[i] = ids
    for i, ids in enumerate(prompts):
        if len(ids) > max_model_len:
            raise APIError(400, f"Pair {i}'s prompt (with `{second_param}[{i}]`) has {len(ids)} tokens; this model "
                                f"takes at most {max_model_len}.", param=f"{second_param}[{i}]",
                           code="context_length_exceeded")
    return prompts


async def _check_shared_first(tokenizer: Tokenizer, firsts: list[str], max_model_len: int, param: str) -> None:
    """A query in every pair is tokenized with each: one the model could not take even alone is refused
    before that (a body-sized query would otherwise be tokenized once per document)."""
    if len(firsts) < 2 or len(set(firsts)) != 1:
        return
    (ids,) = await encode_texts(tokenizer, firsts[:1], add_special_tokens=False)
    if len(ids) > max_model_len:
        raise APIError(400, f"`{param}` has {len(ids)} tokens; this model takes at most {max_model_len} with each "
                            "document.", param=param, code="context_length_exceeded")


def _check(enc: Encoding, i: int, separator: int | None, max_model_len: int, first: str, second: str) -> None:
    if len(enc.ids) > max_model_len:
        raise APIError(400, f"Pair {i} (`{first}` with `{second}`) has {len(enc.ids)} tokens; this model takes at "
                            f"most {max_model_len}.", param=second, code="context_length_exceeded")
    if not follows_the_rule(enc.ids, enc.type_ids, separator):
        raise APIError(400, f"`{first}` holds the model's separator token; remove it.", param=first)


def cut_pairs(tokenizer: Tokenizer, firsts: list[str], seconds: list[str], size: int | None,
              second_max: int | None) -> list[Encoding]:
    """A cross-encoder's pairs of at most `size` tokens, each second text of at most `second_max` of its own (either
    None: no such bound): the second text's tokens cut from its end, the first kept whole, the template's special
    tokens added after (exactly: no text is tokenized twice)."""
    specials = tokenizer.num_special_tokens_to_add(is_pair=True)
    out = []
    for a, b in zip(tokenizer.encode_batch(firsts, add_special_tokens=False),
                    tokenizer.encode_batch(seconds, add_special_tokens=False)):
        room = second_max or len(b.ids)
        if size is not None:
            room = min(room, size - len(a.ids) - specials)
            if room < 1:
                raise APIError(400, f"`truncate_prompt_tokens` is {size}; the query alone takes {size - room} "
                                    "tokens with the model's special tokens.", param="truncate_prompt_tokens")
        if len(b.ids) > room:
            b.truncate(room)
        out.append(tokenizer.post_process(a, b, add_special_tokens=True))
    return out


def cut_text(tokenizer: Tokenizer, text: str, excess: int, param: str, i: int) -> str:
    """`text` without its last `excess` tokens (cut at a token's end: the offsets are characters)."""
    enc = tokenizer.encode(text, add_special_tokens=False)
    keep = len(enc.ids) - excess
    if keep < 1:
        raise APIError(400, f"`truncate_prompt_tokens` leaves no room for `{param}[{i}]` in the model's prompt.",
                       param="truncate_prompt_tokens")
    return text[:enc.offsets[keep - 1][1]]
