"""Rerank and score requests as pure units: decoding and bounds, the pairs each asks for, the activation
choice; the pair rule both processes share (ipc/pair_segments.py) on a real WordPiece tokenizer."""
from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer

from rill.asgi.errors import APIError
from rill.asgi.requests.body import decode_json
from rill.asgi.requests.rerank_request import (
    MAX_DOCUMENTS,
    Document,
    rerank_decoder,
    rerank_pairs,
    score_decoder,
    score_pairs,
    use_activation,
)
from rill.ipc.pair_segments import follows_the_rule, pair_separator, second_segment_start
from tests.helpers.tiny_rerankers import minilm_dir


def rerank(**fields):
    return decode_json(rerank_decoder, json.dumps(fields).encode())


def score(**fields):
    return decode_json(score_decoder, json.dumps(fields).encode())


def error_of(fn, **fields) -> APIError:
    with pytest.raises(APIError) as info:
        fn(**fields)
    assert info.value.status == 400
    return info.value


def test_documents_as_strings_or_objects():
    req = rerank(query="q", documents=["a", {"text": "b", "title": "kept out"}], top_n=1, model="m", extra=1)
    assert req.documents == ["a", Document(text="b")] and req.top_n == 1 and req.return_documents
    assert rerank_pairs(req) == (["q", "q"], ["a", "b"])
    assert rerank_pairs(rerank(query="q", documents=["a"], rank_fields=["text"])) == (["q"], ["a"])


@pytest.mark.parametrize("fields,param", [
    ({"documents": ["a"]}, "query"),
    ({"query": "q", "documents": ["a"] * (MAX_DOCUMENTS + 1)}, "documents"),
    ({"query": "q", "documents": [1]}, "documents[0]"),
    ({"query": "q", "documents": ["a"], "top_n": -1}, "top_n"),
    ({"query": "q", "documents": ["a"], "top_n": 1.5}, "top_n"),
    ({"query": "q", "documents": ["a"], "user": "u" * 300}, "user"),
    ({"query": "q", "documents": ["a"], "rank_fields": ["text"] * 17}, "rank_fields"),
])
def test_rerank_bounds_name_the_field(fields, param):
    assert error_of(rerank, **fields).param == param


def test_rerank_refusals_after_decoding():
    assert error_of(lambda: rerank_pairs(rerank(query="q", documents=[]))).param == "documents"
    assert error_of(lambda: rerank_pairs(rerank(query="q", documents=["a"], rank_fields=["title"]))).param == \
        "rank_fields"
    assert rerank_pairs(rerank(query="q", documents=["a"] * MAX_DOCUMENTS))[1] == ["a"] * MAX_DOCUMENTS


def test_score_pairs_like_vllm():
    assert score_pairs(score(text_1="q", text_2="d")) == (["q"], ["d"])
    assert score_pairs(score(text_1="q", text_2=["a", "b"])) == (["q", "q"], ["a", "b"])
    assert score_pairs(score(text_1=["q"], text_2=["a", "b"])) == (["q", "q"], ["a", "b"])
    assert score_pairs(score(text_1=["q", "r"], text_2=["a", "b"])) == (["q", "r"], ["a", "b"])
    assert error_of(lambda: score_pairs(score(text_1=["q", "r"], text_2=["a", "b", "c"]))).param == "text_2"
    assert error_of(lambda: score_pairs(score(text_1=[], text_2=["a"]))).param == "text_1"
    assert error_of(lambda: score_pairs(score(text_1="q", text_2=[]))).param == "text_2"
    assert error_of(score, text_1="q", text_2=["a"] * (MAX_DOCUMENTS + 1)).param == "text_2"
    assert error_of(score, text_1=[1], text_2="a").param == "text_1[0]"


def test_activation_by_either_name():
    assert use_activation(score(text_1="q", text_2="d"))
    assert not use_activation(score(text_1="q", text_2="d", use_activation=False))
    assert not use_activation(rerank(query="q", documents=["d"], activation=False))
    assert use_activation(rerank(query="q", documents=["d"], activation=False, use_activation=True))


@pytest.fixture(scope="module")
def wordpiece() -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def test_the_separator_and_the_second_segment(wordpiece):
    sep = pair_separator(wordpiece)
    assert sep == wordpiece.token_to_id("[SEP]")
    enc = wordpiece.encode("what is a cat", "a small feline")
    assert enc.tokens[0] == "[CLS]" and enc.tokens[-1] == "[SEP]"
    start = second_segment_start(enc.ids, sep)
    assert enc.type_ids == [0] * start + [1] * (len(enc.ids) - start)
    assert follows_the_rule(enc.ids, enc.type_ids, sep)
    empty = wordpiece.encode("q", "")  # [CLS] q [SEP] [SEP]: the second segment is its separator alone
    assert follows_the_rule(empty.ids, empty.type_ids, sep)
    inside = wordpiece.encode("a [SEP] b", "c")  # the tokenizer reads the text as the separator token
    assert not follows_the_rule(inside.ids, inside.type_ids, sep)
    in_document = wordpiece.encode("a", "b [SEP] c")  # after the first separator: no harm
    assert follows_the_rule(in_document.ids, in_document.type_ids, sep)
    assert follows_the_rule(inside.ids, [0] * len(inside.ids), None)  # a model without token types
