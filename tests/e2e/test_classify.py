"""End to end: vLLM's /classify (and SGLang's /v1/classify) served by a tiny random-weight BERT of three labels;
the probabilities against transformers' own forward, the raw logits, token-id inputs, truncation, and the 4xx
answers (a generating server's 400 for /classify is in test_auth)."""
from __future__ import annotations

import httpx
import pytest
import torch

from tests.helpers.server import sdk_client, start_server, stop_server
from tests.helpers.tiny_classifiers import LABELS, reference_class_logits, save_tiny_text_classifier
from tests.helpers.tiny_rerankers import MAX_POSITIONS

CLASSIFIER = "tiny-classifier"
TEXTS = ["I loved every minute of it", "terrible, just terrible", "Ünïcödé text, 日本語 too.", "ok"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_text_classifier(tmp_path_factory.mktemp("classifier"))


@pytest.fixture(scope="module")
def srv(model_dir, tmp_path_factory):
    server = start_server(tmp_path_factory, "--model", str(model_dir), "--served-model-name", CLASSIFIER)
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def logits(model_dir) -> torch.Tensor:
    return reference_class_logits(model_dir, TEXTS)


def post(srv, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{srv.base_url}{path}", json=body, timeout=60)


def error_of(resp: httpx.Response, status: int = 400) -> dict:
    assert resp.status_code == status, resp.text
    return resp.json()["error"]


def test_classify_matches_the_models_own_probabilities(srv, logits):
    body = post(srv, "/classify", {"model": CLASSIFIER, "input": TEXTS}).json()
    assert body["object"] == "list" and body["model"] == CLASSIFIER and body["id"].startswith("classify-")
    assert [d["index"] for d in body["data"]] == list(range(len(TEXTS)))
    probs = torch.softmax(logits, dim=-1)
    for d, p in zip(body["data"], probs):
        assert d["num_classes"] == len(LABELS)
        assert d["probs"] == pytest.approx(p.tolist(), abs=1e-5)
        assert d["label"] == LABELS[int(p.argmax())]
    assert len({d["label"] for d in body["data"]}) > 1  # the texts are told apart (the check could fail)
    usage = body["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] > 2 * len(TEXTS) and usage["completion_tokens"] == 0
    assert usage["prompt_tokens_details"] is None
    assert post(srv, "/v1/classify", {"input": TEXTS}).json()["data"] == body["data"]  # SGLang's path, no model


def test_raw_logits_one_text_and_token_ids(srv, model_dir, logits):
    raw = post(srv, "/classify", {"input": TEXTS[1], "use_activation": False}).json()["data"]
    assert len(raw) == 1 and raw[0]["probs"] == pytest.approx(logits[1].tolist(), abs=1e-4)
    assert post(srv, "/classify", {"input": TEXTS[1], "activation": False}).json()["data"] == raw  # vLLM's old name
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.no_padding()
    ids = [tokenizer.encode(t).ids for t in TEXTS[:2]]
    by_ids = post(srv, "/classify", {"input": ids}).json()["data"]
    for d, p in zip(by_ids, torch.softmax(logits[:2], -1)):
        assert d["probs"] == pytest.approx(p.tolist(), abs=1e-5)
    one = post(srv, "/classify", {"input": ids[0]}).json()["data"]  # one list of ids is one input
    assert len(one) == 1 and one[0]["probs"] == pytest.approx(by_ids[0]["probs"], abs=1e-6)


def test_truncate_prompt_tokens_keeps_the_last_tokens(srv):
    long_text = " ".join(TEXTS * 40)
    body = post(srv, "/classify", {"input": long_text, "truncate_prompt_tokens": -1}).json()
    assert body["usage"]["prompt_tokens"] == MAX_POSITIONS
    err = error_of(post(srv, "/classify", {"input": long_text}))
    assert err["param"] == "input[0]" and err["code"] == "context_length_exceeded"


def test_bad_classify_requests_are_400s(srv):
    for body, param in (({"input": []}, "input"), ({"input": [1, "a"]}, "input"), ({"input": [[]]}, "input"),
                        ({"input": [10**9]}, "input[0]"), ({"input": "hi", "truncate_prompt_tokens": 0},
                                                           "truncate_prompt_tokens"),
                        ({"input": ["x"] * 5000}, "input"), ({"input": "hi", "priority": "high"}, "priority")):
        assert error_of(post(srv, "/classify", body))["param"] == param, body
    assert error_of(post(srv, "/classify", {"model": "other", "input": "hi"}), 404)["param"] == "model"


def test_a_classifier_server_refuses_the_other_routes(srv):
    chat = {"model": CLASSIFIER, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    for path, body in (("/v1/chat/completions", chat), ("/v1/completions", {"model": CLASSIFIER, "prompt": "Hi"}),
                       ("/v1/embeddings", {"model": CLASSIFIER, "input": "Hi"})):
        err = error_of(post(srv, path, body))
        assert err["param"] == "model" and "classifier" in err["message"] and "/classify" in err["message"]
    for path, body in (("/v1/rerank", {"query": "q", "documents": ["d"]}), ("/score", {"text_1": "a", "text_2": "b"})):
        assert error_of(post(srv, path, body))["param"] == "model"
    models = sdk_client(srv).models.list()  # the SDK, strictly validated, sees the classifier as a model
    assert [m.id for m in models.data] == [CLASSIFIER]

