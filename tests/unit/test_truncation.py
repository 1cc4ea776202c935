"""asgi/prompt/truncation.py: vLLM's truncate_prompt_tokens on token ids, with the tokenizer's specials kept."""
from __future__ import annotations

import asyncio

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from rill.asgi.errors import APIError
from rill.asgi.prompt.encoding import tokenize_prompts
from rill.asgi.prompt.truncation import added_specials, truncate, truncated_prompts


def bert_like() -> Tokenizer:
    vocab = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, **{w: i + 3 for i, w in enumerate("a b c d e f".split())}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 1),
                                                                                                ("[SEP]", 2)])
    return tok


def test_the_last_k_tokens_and_the_specials_around_them():
    tok = bert_like()
    assert added_specials(tok) == (1, 1)
    ids = tok.encode("a b c d e f").ids  # [CLS] a..f [SEP]
    assert truncated_prompts(tok, ["a b c d e f"], [ids], 4, 100) == [[1, 7, 8, 2]]  # [CLS] e f [SEP]
    assert truncated_prompts(tok, [ids], [ids], 4, 100) == [ids[-4:]]  # token ids: cut as they are
    with pytest.raises(APIError) as only_specials:
        truncated_prompts(tok, ["a b c d e f"], [ids], 2, 100)
    assert only_specials.value.param == "truncate_prompt_tokens"


def test_sizes():
    prompts = [[5, 6, 7], list(range(10))]
    assert truncate(prompts, None, 8) is prompts
    assert truncate(prompts, -1, 8) == [[5, 6, 7], list(range(2, 10))]  # -1: the context length
    assert truncate(prompts, 3, 8) == [[5, 6, 7], [7, 8, 9]]
    short = [[1, 2]]
    assert truncate(short, 5, 8) is short
    for bad in (0, 9):
        with pytest.raises(APIError) as refused:
            truncate(prompts, bad, 8)
        assert refused.value.status == 400 and refused.value.param == "truncate_prompt_tokens"


def test_without_the_tokenizers_specials_a_text_is_cut_as_it_is():
    """vLLM's add_special_tokens false: no [CLS] and [SEP] around the text, and none kept when it is cut."""
    tok = bert_like()
    [plain] = asyncio.run(tokenize_prompts(tok, ["a b c d e f"], 100, "prompt", add_special_tokens=False))
    assert plain == [3, 4, 5, 6, 7, 8]
    assert truncated_prompts(tok, ["a b c d e f"], [plain], 2, 100, specials=False) == [[7, 8]]
