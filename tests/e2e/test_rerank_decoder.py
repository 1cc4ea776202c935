"""End to end: a decoder served as a yes/no reranker (`--task score`, Qwen3-Reranker's recipe) on a tiny random
Qwen3: rerank and score against transformers' own last-token logits on Qwen3-Reranker's prompt, written out here
from its model card; `instruction`; what such a server refuses."""
from __future__ import annotations

import httpx
import pytest
import torch

from tests.helpers.server import start_server, stop_server
from tests.helpers.tiny_rerankers import reference_yes_no, save_tiny_yes_no_reranker

RERANKER = "tiny-qwen3-reranker"
QUERY = "What is the capital of China?"
DOCUMENTS = ["The capital of China is Beijing.", "Gravity is a force that attracts two bodies.", "Beijing", ""]
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


def model_card_prompt(query: str, document: str, instruction: str = DEFAULT_INSTRUCTION) -> str:
    """Qwen3-Reranker's model card: prefix + format_instruction(...) + suffix."""
    prefix = ('<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the '
              'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n')
    suffix = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    return f"{prefix}<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}{suffix}"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_yes_no_reranker(tmp_path_factory.mktemp("yes_no_reranker"))


@pytest.fixture(scope="module")
def srv(model_dir, tmp_path_factory):
    server = start_server(tmp_path_factory, "--model", str(model_dir), "--served-model-name", RERANKER,
                          "--task", "score", "--dtype", "float32")
    yield server
    stop_server(server)


def post(srv, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{srv.base_url}{path}", json=body, timeout=60)


def test_rerank_is_the_models_yes_against_no(srv, model_dir):
    expected = torch.sigmoid(reference_yes_no(model_dir, [model_card_prompt(QUERY, d) for d in DOCUMENTS]))
    body = post(srv, "/v1/rerank", {"model": RERANKER, "query": QUERY, "documents": DOCUMENTS}).json()
    results = body["results"]
    assert [r["index"] for r in results] == sorted(range(len(DOCUMENTS)), key=lambda i: -expected[i].item())
    for r in results:
        assert r["relevance_score"] == pytest.approx(expected[r["index"]].item(), abs=1e-4)
    assert expected.max() - expected.min() > 0.005  # the documents are told apart (the check could fail)


def test_truncate_prompt_tokens_cuts_each_documents_end(srv):
    """vLLM's truncate_prompt_tokens: each pair's prompt at most k tokens, a long document's end cut to fit (to
    within a token or two of k: the cut text is tokenized again in the prompt), a short one's prompt whole."""
    long_doc = "Beijing is the capital of China. " * 40
    k = 120
    usage = lambda body: post(srv, "/v1/rerank", {"query": QUERY, **body}).json()["usage"]["prompt_tokens"]  # noqa
    short = usage({"documents": ["Beijing"]})
    assert usage({"documents": [long_doc]}) > 2 * k > short
    cut = usage({"documents": [long_doc, "Beijing"], "truncate_prompt_tokens": k}) - short
    assert k - 2 <= cut <= k
    per_doc = usage({"documents": [long_doc, "Beijing"], "max_tokens_per_doc": 8}) - short  # Cohere's
    assert per_doc <= short + 8 and per_doc < cut
    refused = post(srv, "/score", {"text_1": QUERY, "text_2": "x", "truncate_prompt_tokens": 10}).json()
    assert refused["error"]["param"] == "truncate_prompt_tokens"  # the template and query alone take more


def test_score_with_an_instruction_and_raw_margins(srv, model_dir):
    instruction = "Judge whether the document names a city"
    prompts = [model_card_prompt(QUERY, d, instruction) for d in DOCUMENTS[:2]]
    margins = reference_yes_no(model_dir, prompts)
    body = post(srv, "/score", {"text_1": QUERY, "text_2": DOCUMENTS[:2], "instruction": instruction,
                                "use_activation": False}).json()
    assert [d["score"] for d in body["data"]] == pytest.approx(margins.tolist(), abs=1e-4)
    default = post(srv, "/score", {"text_1": QUERY, "text_2": DOCUMENTS[:2], "use_activation": False}).json()
    assert [d["score"] for d in default["data"]] != pytest.approx(margins.tolist(), abs=1e-4)  # it reached the prompt


def test_a_reranker_server_refuses_the_rest(srv):
    chat = {"model": RERANKER, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    for path, body in (("/v1/chat/completions", chat), ("/v1/embeddings", {"model": RERANKER, "input": "Hi"})):
        resp = post(srv, path, body)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "model", resp.text
        assert "yes-no" in resp.json()["error"]["message"]
    resp = post(srv, "/v1/rerank", {"query": QUERY, "documents": ["word " * 600]})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "documents[0]", resp.text
    assert resp.json()["error"]["code"] == "context_length_exceeded"
    resp = post(srv, "/score", {"text_1": QUERY, "text_2": "a", "instruction": "x" * 5000})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "instruction", resp.text
