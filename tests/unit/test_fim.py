"""Fill-in-the-middle prompts: each family's FIM tokens found in a tokenizer, and the layout around them."""
from __future__ import annotations

import asyncio

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from rill.asgi.errors import APIError
from rill.asgi.prompt.fim import FAMILIES, FimTokens, fim_prompts, fim_tokens


def tokenizer_with(*specials: str) -> Tokenizer:
    vocab = {"[UNK]": 0, "a": 1, "b": 2, **{name: 10 + i for i, name in enumerate(specials)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


@pytest.mark.parametrize("names", FAMILIES, ids=lambda names: names[0])
def test_each_familys_tokens_are_found(names):
    tok = tokenizer_with(*(n for n in names if n))
    fim = fim_tokens(tok, vocab_size=100)
    assert fim == FimTokens(10, 11, 12 if names[2] else None)
    assert fim_tokens(tok, vocab_size=11) is None  # past the model's vocabulary: not the model's
    assert fim_tokens(tokenizer_with("<fim_prefix>", "<fim_suffix>"), vocab_size=100) is None  # no middle


def test_the_layout_prefix_suffix_middle_or_suffix_first():
    assert FimTokens(10, 11, 12).layout([1], [2, 2]) == [10, 1, 11, 2, 2, 12]
    assert FimTokens(10, 11, None).layout([1], [2, 2]) == [11, 2, 2, 10, 1]  # Codestral


def test_prompts_texts_and_ids_and_no_fim_tokens():
    tok = tokenizer_with("<fim_prefix>", "<fim_suffix>", "<fim_middle>")
    fim = fim_tokens(tok, vocab_size=100)
    assert asyncio.run(fim_prompts(tok, fim, ["a", ""], "b a", 100)) == [[10, 1, 11, 2, 1, 12], [10, 11, 2, 1, 12]]
    assert asyncio.run(fim_prompts(tok, fim, [[2, 2]], "a", 100)) == [[10, 2, 2, 11, 1, 12]]
    with pytest.raises(APIError) as err:
        asyncio.run(fim_prompts(tok, fim, [[200]], "a", 100))  # ids still checked against the vocabulary
    assert err.value.param == "prompt[0]"
    with pytest.raises(APIError) as err:
        asyncio.run(fim_prompts(tok, None, ["a"], "b", 100))
    assert err.value.param == "suffix" and err.value.status == 400


def test_infill_context_with_the_repository_and_file_separator_tokens():
    """llama.cpp's layout: <repo_name>myproject, <file_sep>NAME TEXT per chunk, <file_sep>filename, then the FIM
    layout and `prompt`."""
    from rill.asgi.requests.infill_request import ExtraChunk, InfillRequest, infill_prompt

    tok = tokenizer_with("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<repo_name>", "<file_sep>", "myproject",
                         "filename", "u.py")
    fim = fim_tokens(tok, vocab_size=100)
    assert (fim.repo_name, fim.file_sep) == (13, 14)
    req = InfillRequest(input_prefix="a", input_suffix="b", prompt="a a", input_extra=[ExtraChunk("b b", "u.py")])
    assert asyncio.run(infill_prompt(tok, fim, req)) == [13, 15, 14, 17, 2, 2, 14, 16, 10, 1, 11, 2, 12, 1, 1]
    plain = fim_tokens(tokenizer_with("<fim_prefix>", "<fim_suffix>", "<fim_middle>"), vocab_size=100)
    assert asyncio.run(infill_prompt(tok, plain, InfillRequest(input_prefix="a"))) == [10, 1, 11, 12]
