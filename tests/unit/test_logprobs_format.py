"""Token text and bytes, and logprobs in chat's and completions' wire shapes (no server)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from rill.asgi.output.logprobs_format import ChatLogprobs, CompletionLogprobs, merge_completion_logprobs
from rill.asgi.output.token_text import TokenTexts
from rill.ipc.logprobs import TokenLogprobs


@pytest.fixture(scope="module")
def texts(tokenizer) -> TokenTexts:
    return TokenTexts(tokenizer)


def lp(rows: list[list[tuple[int, float]]]) -> TokenLogprobs:
    """Rows of (token id, logprob): the chosen token first, then the top ones."""
    ids = np.array([[t for t, _ in r] for r in rows], dtype=np.int32)
    logprobs = np.array([[x for _, x in r] for r in rows], dtype=np.float32)
    return TokenLogprobs(ids, logprobs, np.ones(len(rows), dtype=np.int32))


def test_token_bytes_join_into_the_text_even_across_split_characters(tokenizer, texts):
    text = "héllo 😀 world"
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert bytes(b for i in ids for b in texts.bytes(i)).decode() == text
    assert any(texts.text(i).endswith("\ufffd") for i in ids)  # the emoji's pieces, as vLLM shows them
    assert texts.text(2) == "<|im_end|>" and texts.bytes(2) == list(b"<|im_end|>")  # special tokens shown


def test_chat_entries_top_k_and_clamped_minus_infinity(tokenizer, texts):
    a, b, c = (tokenizer.token_to_id(t) for t in ("Ġsea", "Ġocean", "Ġbanana"))
    content = ChatLogprobs(texts, 2).content(lp([[(b, -1.5), (a, -0.25), (b, -1.5), (c, -3.0)],
                                                 [(c, -math.inf), (a, -0.5), (b, -0.75), (c, -math.inf)]]))
    assert content[0] == {"token": " ocean", "logprob": -1.5, "bytes": list(b" ocean"),
                          "top_logprobs": [{"token": " sea", "logprob": -0.25, "bytes": list(b" sea")},
                                           {"token": " ocean", "logprob": -1.5, "bytes": list(b" ocean")}]}
    assert content[1]["logprob"] == -9999.0 and len(content[1]["top_logprobs"]) == 2
    assert ChatLogprobs(texts, 0).content(lp([[(a, -0.25), (a, -0.25)]]))[0]["top_logprobs"] == []
    assert ChatLogprobs(texts, 3).content(None) == []


def test_completion_pieces_join_into_the_whole(tokenizer, texts):
    a, b, c = (tokenizer.token_to_id(t) for t in ("Ġsea", "Ġocean", "Ġbanana"))
    rows = [[(b, -1.5), (a, -0.25)], [(a, -0.25), (a, -0.25)], [(c, -math.inf), (a, -0.5)]]
    whole = CompletionLogprobs(texts, 1).piece(lp(rows))
    assert whole == {"tokens": [" ocean", " sea", " banana"], "token_logprobs": [-1.5, -0.25, -9999.0],
                     "top_logprobs": [{" sea": -0.25, " ocean": -1.5}, {" sea": -0.25},
                                      {" sea": -0.5, " banana": -9999.0}],
                     "text_offset": [0, 6, 10]}
    stream = CompletionLogprobs(texts, 1)
    joined = stream.piece(None)
    for row in rows:
        merge_completion_logprobs(joined, stream.piece(lp([row])))
    assert joined == whole
