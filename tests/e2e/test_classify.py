"""End to end: vLLM's /classify (and SGLang's /v1/classify) served by a tiny random-weight BERT of three labels, and
by a tiny Llama reward model (one label, --task classify) in vLLM's chat form; the probabilities against
transformers' own forward, the raw logits, token-id inputs, truncation, and the 4xx answers (a generating server's
400 for /classify is in test_auth)."""
from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest
import torch

from tests.helpers.server import sdk_client, start_servers, stop_server
from tests.helpers.tiny_classifiers import (
    LABELS,
    reference_class_logits,
    save_tiny_decoder_classifier,
    save_tiny_text_classifier,
)
from tests.helpers.tiny_rerankers import MAX_POSITIONS

CLASSIFIER = "tiny-classifier"
REWARD = "tiny-reward"
TEXTS = ["I loved every minute of it", "terrible, just terrible", "Ünïcödé text, 日本語 too.", "ok"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_text_classifier(tmp_path_factory.mktemp("classifier"))


@pytest.fixture(scope="module")
def reward_dir(tmp_path_factory):
    return save_tiny_decoder_classifier(tmp_path_factory.mktemp("reward"), num_labels=1)


@pytest.fixture(scope="module")
def servers(model_dir, reward_dir, tmp_path_factory):
    both = start_servers(tmp_path_factory, ("--model", str(model_dir), "--served-model-name", CLASSIFIER),
                         ("--model", str(reward_dir), "--served-model-name", REWARD, "--task", "classify"))
    yield both
    for server in both:
        stop_server(server)


@pytest.fixture(scope="module")
def srv(servers):
    return servers[0]


@pytest.fixture(scope="module")
def reward(servers):
    return servers[1]


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
    pooled = post(srv, "/pooling", {"input": TEXTS}).json()  # vLLM's: the probabilities alone
    assert pooled["id"].startswith("pool-") and [d["data"] for d in pooled["data"]] == [d["probs"] for d in body["data"]]
    raw = post(srv, "/pooling", {"input": TEXTS[:1], "use_activation": False, "encoding_format": "base64"}).json()
    assert np.frombuffer(base64.b64decode(raw["data"][0]["data"]), dtype="<f4") == pytest.approx(
        logits[0].tolist(), abs=1e-4)


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



def test_a_reward_model_scores_a_conversation(reward, reward_dir):
    """vLLM's chat form: the messages rendered by the chat template (no generation prompt), scored at the last
    token; the same as the rendered ids sent as input, and as transformers' forward over them."""
    from transformers import AutoModelForSequenceClassification

    messages = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4."}]
    body = post(reward, "/classify", {"model": REWARD, "messages": messages, "use_activation": False}).json()
    (data,) = body["data"]
    assert data["num_classes"] == 1 and data["label"] == "LABEL_0"
    ids = post(reward, "/tokenize", {"messages": messages, "add_generation_prompt": False}).json()["tokens"]
    assert body["usage"]["prompt_tokens"] == len(ids)
    model = AutoModelForSequenceClassification.from_pretrained(reward_dir).eval()
    with torch.inference_mode():
        expected = model(input_ids=torch.tensor([ids])).logits[0, 0].item()
    assert data["probs"] == pytest.approx([expected], abs=1e-3)
    by_ids = post(reward, "/classify", {"input": ids}).json()["data"][0]  # activated: sigmoid, for one label
    assert by_ids["probs"] == pytest.approx([torch.sigmoid(torch.tensor(expected)).item()], abs=1e-4)
    other = post(reward, "/classify", {"messages": [*messages[:1], {"role": "assistant", "content": "5."}],
                                       "use_activation": False}).json()["data"][0]
    assert other["probs"] != data["probs"]  # the answer's text reaches the score
    err = error_of(post(reward, "/classify", {"messages": []}))
    assert err["param"] == "messages"
    err = error_of(post(reward, "/classify", {"messages": [{"role": "user", "content": "word " * 400}]}))
    assert err["param"] == "messages" and err["code"] == "context_length_exceeded"
