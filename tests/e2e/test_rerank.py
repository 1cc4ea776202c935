"""End to end: rerank (Jina's and Cohere's shapes, through httpx and Cohere's own SDK) and vLLM's score, served
by a tiny random-weight cross-encoder; the scores against transformers' own forward, and the 4xx answers."""
from __future__ import annotations

import cohere
import httpx
import pytest
import torch

from tests.helpers.server import start_server, stop_server
from tests.helpers.tiny_rerankers import MAX_POSITIONS, reference_logits, save_tiny_cross_encoder

RERANKER = "tiny-reranker"
QUERY = "What animals live near Peru?"
DOCUMENTS = ["The llama is a domesticated South American camelid.", "Quarterly revenue grew by 4 percent.",
             "Guanacos are camelids native to South America, close to the llama.", "Ünïcödé text, 日本語 too.", "cats"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_cross_encoder(tmp_path_factory.mktemp("cross_encoder"))


@pytest.fixture(scope="module")
def srv(model_dir, tmp_path_factory):
    server = start_server(tmp_path_factory, "--model", str(model_dir), "--served-model-name", RERANKER)
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def expected(model_dir) -> torch.Tensor:
    """transformers' sigmoid scores of (QUERY, each document), sentence-transformers' default for one label."""
    return torch.sigmoid(reference_logits(model_dir, [(QUERY, d) for d in DOCUMENTS]))


def post(srv, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{srv.base_url}{path}", json=body, timeout=60)


def error_of(resp: httpx.Response, status: int = 400) -> dict:
    assert resp.status_code == status, resp.text
    return resp.json()["error"]


def test_rerank_matches_the_models_own_scores(srv, expected):
    body = post(srv, "/v1/rerank", {"model": RERANKER, "query": QUERY, "documents": DOCUMENTS}).json()
    assert body["model"] == RERANKER and body["id"].startswith("rerank-")
    results = body["results"]
    assert sorted(r["index"] for r in results) == list(range(len(DOCUMENTS)))
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)  # most relevant first
    for r in results:
        assert r["relevance_score"] == pytest.approx(expected[r["index"]].item(), abs=1e-4)
        assert r["document"] == {"text": DOCUMENTS[r["index"]]}
    assert max(scores) - min(scores) > 0.05  # the documents are told apart (the check could fail)
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 3 * len(DOCUMENTS)


def test_token_types_reach_the_model(model_dir, expected):
    """The scores above depend on BERT's token types: without them transformers' own answer differs."""
    untyped = torch.sigmoid(reference_logits(model_dir, [(QUERY, d) for d in DOCUMENTS], token_types=False))
    assert (untyped - expected).abs().max() > 1e-2


def test_every_route_and_document_form_gives_one_answer(srv):
    body = {"query": QUERY, "documents": [{"text": d, "title": "ignored"} for d in DOCUMENTS], "top_n": 2,
            "return_documents": False}
    answers = [post(srv, path, body).json() for path in ("/v1/rerank", "/v2/rerank", "/rerank", "/v3/rerank")]
    top = [(r["index"], r["relevance_score"]) for r in answers[0]["results"]]
    assert len(top) == 2 and all("document" not in r for r in answers[0]["results"])
    for answer in answers[1:]:
        assert [(r["index"], r["relevance_score"]) for r in answer["results"]] == top
    everything = post(srv, "/rerank", {"query": QUERY, "documents": DOCUMENTS, "top_n": 0}).json()["results"]
    assert [(r["index"], r["relevance_score"]) for r in everything][:2] == top and len(everything) == len(DOCUMENTS)


def test_score_pairs_as_vllm_does(srv, model_dir, expected):
    one = post(srv, "/score", {"model": RERANKER, "text_1": QUERY, "text_2": DOCUMENTS}).json()
    assert one["object"] == "list" and one["model"] == RERANKER and one["id"].startswith("score-")
    assert [d["index"] for d in one["data"]] == list(range(len(DOCUMENTS)))
    assert {d["object"] for d in one["data"]} == {"score"}
    assert [d["score"] for d in one["data"]] == pytest.approx(expected.tolist(), abs=1e-4)
    assert one["usage"]["prompt_tokens"] == one["usage"]["total_tokens"] and one["usage"]["completion_tokens"] == 0
    firsts = [QUERY, "cats", DOCUMENTS[0]]
    zipped = post(srv, "/v1/score", {"text_1": firsts, "text_2": DOCUMENTS[:3], "use_activation": False}).json()
    logits = reference_logits(model_dir, list(zip(firsts, DOCUMENTS[:3])))
    assert [d["score"] for d in zipped["data"]] == pytest.approx(logits.tolist(), abs=1e-4)  # the raw logits


def test_cohere_sdk_reranks(srv, expected):
    """Cohere's SDK, v2 (`/v2/rerank`) and v1 (`/v1/rerank`), pointed at the server."""
    best = sorted(range(len(DOCUMENTS)), key=lambda i: -expected[i].item())
    v2 = cohere.ClientV2(api_key="unused", base_url=srv.base_url, timeout=60, max_retries=0)
    reply = v2.rerank(model=RERANKER, query=QUERY, documents=DOCUMENTS, top_n=3)
    assert [r.index for r in reply.results] == best[:3]
    assert [r.relevance_score for r in reply.results] == pytest.approx([expected[i].item() for i in best[:3]], abs=1e-4)
    v1 = cohere.Client(api_key="unused", base_url=srv.base_url, timeout=60)
    reply = v1.rerank(model=RERANKER, query=QUERY, documents=[{"text": d} for d in DOCUMENTS], top_n=2,
                      return_documents=True)
    assert [(r.index, r.document.text) for r in reply.results] == [(i, DOCUMENTS[i]) for i in best[:2]]


def test_a_cross_encoder_server_refuses_generation_and_embeddings(srv):
    chat = {"model": RERANKER, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    for path, body in (("/v1/chat/completions", chat), ("/v1/completions", {"model": RERANKER, "prompt": "Hi"}),
                       ("/v1/embeddings", {"model": RERANKER, "input": "Hi"})):
        err = error_of(post(srv, path, body))
        assert err["param"] == "model" and "cross-encoder" in err["message"] and "/rerank" in err["message"]


def test_truncate_prompt_tokens_cuts_the_documents_end(srv, model_dir):
    """vLLM's truncate_prompt_tokens on a pair: the query whole, the document's tokens cut from its end, the
    template's [CLS] and [SEP]s kept; the score is the model's own on the cut pair. -1 cuts to the context."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.no_padding()  # its tokenizer.json pads to 128, which the server turns off
    long_doc = " ".join(DOCUMENTS[:3] * 20)
    k = 24
    body = post(srv, "/v1/rerank", {"model": RERANKER, "query": QUERY, "documents": [long_doc, "cats"],
                                    "truncate_prompt_tokens": k}).json()
    query_ids = tokenizer.encode(QUERY, add_special_tokens=False).ids
    doc = tokenizer.encode(long_doc, add_special_tokens=False)
    cut = long_doc[:doc.offsets[k - len(query_ids) - 3 - 1][1]]  # [CLS] q [SEP] d [SEP]
    expected = torch.sigmoid(reference_logits(model_dir, [(QUERY, cut), (QUERY, "cats")]))
    scores = {r["index"]: r["relevance_score"] for r in body["results"]}
    assert body["usage"]["prompt_tokens"] == k + len(query_ids) + 4  # and "cats"'s pair whole
    assert scores == pytest.approx({0: expected[0].item(), 1: expected[1].item()}, abs=1e-4)
    assert body["results"][0]["document"]["text"] in (long_doc, "cats")  # the documents as sent
    whole = post(srv, "/score", {"text_1": QUERY, "text_2": long_doc, "truncate_prompt_tokens": -1}).json()
    assert whole["usage"]["prompt_tokens"] == MAX_POSITIONS
    short = error_of(post(srv, "/v1/rerank", {"query": QUERY, "documents": ["a"], "truncate_prompt_tokens": 5}))
    assert short["param"] == "truncate_prompt_tokens"  # the query alone does not fit
    # Cohere's max_tokens_per_doc: each document's own tokens, the same cut.
    per_doc = post(srv, "/v2/rerank", {"query": QUERY, "documents": [long_doc, "cats"],
                                       "max_tokens_per_doc": k - len(query_ids) - 3}).json()
    assert per_doc["usage"] == body["usage"]
    assert {r["index"]: r["relevance_score"] for r in per_doc["results"]} == scores


@pytest.mark.parametrize("path,body,param", [
    ("/v1/rerank", {"documents": ["a"]}, "query"),
    ("/v1/rerank", {"query": "q", "documents": []}, "documents"),
    ("/v1/rerank", {"query": "q", "documents": "a"}, "documents"),
    ("/v1/rerank", {"query": "q", "documents": ["a"] * 2049}, "documents"),
    ("/v1/rerank", {"query": "q", "documents": [{"title": "no text"}]}, "documents[0].text"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "top_n": -1}, "top_n"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "return_documents": "yes"}, "return_documents"),
    ("/v1/rerank", {"query": "q", "documents": ["a"], "rank_fields": ["title"]}, "rank_fields"),
    ("/v1/rerank", {"query": "a [SEP] b", "documents": ["a"]}, "query"),  # the separator would split it wrongly
    ("/v1/rerank", {"query": "q", "documents": ["a", "word " * MAX_POSITIONS]}, "documents[1]"),
    ("/v1/rerank", {"query": "word " * (MAX_POSITIONS + 1), "documents": ["a", "b"]}, "query"),  # before the pairs
    ("/score", {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, "text_2"),
    ("/score", {"text_1": [], "text_2": ["a"]}, "text_1"),
    ("/score", {"text_1": "a", "text_2": []}, "text_2"),
    ("/score", {"text_1": "a"}, "text_2"),
    ("/score", {"text_1": ["a", "b [SEP]"], "text_2": ["a", "b"]}, "text_1[1]"),
    ("/score", {"text_1": "a", "text_2": ["a"] * 2049}, "text_2"),
])
def test_bad_requests_are_400s_naming_the_field(srv, path, body, param):
    err = error_of(post(srv, path, body))
    assert err["param"] == param, err
    assert err["type"] == "invalid_request_error"


def test_an_unknown_model_is_a_404(srv):
    for name in ("other", "x" * 300):  # `model` is compared only, as on every route
        err = error_of(post(srv, "/v1/rerank", {"model": name, "query": "q", "documents": ["a"]}), 404)
        assert err["param"] == "model"
