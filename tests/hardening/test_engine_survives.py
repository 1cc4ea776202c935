"""Hardening: the engine survives any one request or admin call, and a reloaded adapter never
serves K/V computed with its old weights.

One server for the module: bench's tiny random-weight model with runtime LoRA updates and queue
bounds. Broken adapters, a broken grammar and broken tokenizer input are sent while streams run;
every stream must still finish in full, and the server must stay up.
"""
from __future__ import annotations

import concurrent.futures
import json

import httpx
import pytest

from rill.bench.serving.tiny_model import write_tiny_model
from tests.helpers.openapi import validate
from tests.helpers.server import start_server, stop_server
from tests.helpers.tiny_lora import broken_adapters, write_adapter

MODEL = "tiny"
MAX_NUM_SEQS = 8
MAX_QUEUED_REQUESTS = 8
MAX_QUEUED_TOKENS = 2048
PROMPT = list(range(1000, 1040))  # 40 tokens: two full 16-token blocks the prefix cache can hold


@pytest.fixture(scope="module")
def srv(model_dir, tmp_path_factory):
    tiny = write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")
    server = start_server(tmp_path_factory, "--model", str(tiny), "--load-format", "dummy", "--served-model-name",
                          MODEL, "--max-model-len", "256", "--kv-cache-memory", "64MiB", "--enable-lora",
                          "--max-loras", "3", "--max-lora-rank", "8", "--allow-runtime-lora-updating",
                          "--max-num-seqs", str(MAX_NUM_SEQS), "--max-queued-requests", str(MAX_QUEUED_REQUESTS),
                          "--max-queued-tokens", str(MAX_QUEUED_TOKENS))
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("adapters")
    return {"a": str(write_adapter(root / "a", seed=1)), "b": str(write_adapter(root / "b", seed=2))}


def load(srv, name: str, path: str, **extra) -> httpx.Response:
    return httpx.post(f"{srv.base_url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path, **extra},
                      timeout=60)


def unload(srv, name: str) -> httpx.Response:
    return httpx.post(f"{srv.base_url}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=60)


def complete(srv, model: str, **extra) -> httpx.Response:
    return httpx.post(f"{srv.base_url}/v1/completions", timeout=60, json={
        "model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, **extra})


def stream_to_the_end(srv, max_tokens: int) -> tuple[int, bool]:
    """A streamed completion read to its end: (tokens in its usage, whether it ended with [DONE])."""
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    usage, done = 0, False
    with httpx.stream("POST", f"{srv.base_url}/v1/completions", json=body, timeout=120) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                assert "error" not in event, event
                usage = (event.get("usage") or {}).get("completion_tokens", usage)
    return usage, done


def test_broken_inputs_fail_alone_while_other_streams_finish(srv, tmp_path):
    """Each broken adapter kind once left the engine's busy loop (the server exited 1 and the call
    never got an answer): now each is a 400 naming why, and running streams never notice."""
    broken = broken_adapters(tmp_path)
    num_streams, max_tokens = 3, 120
    with concurrent.futures.ThreadPoolExecutor(num_streams) as pool:
        streams = [pool.submit(stream_to_the_end, srv, max_tokens) for _ in range(num_streams)]
        answers = {kind: load(srv, f"broken-{i}", str(path)) for i, (kind, path) in enumerate(broken.items())}
        # A grammar the edge refuses, and tokenizer input the engine must never see.
        grammar = httpx.post(f"{srv.base_url}/v1/completions", timeout=60, json={
            "model": MODEL, "prompt": "x", "max_tokens": 4, "guided_regex": "(unclosed"})
        out_of_vocab = complete(srv, MODEL, prompt=[1, 2, 10**9])
        negative = complete(srv, MODEL, prompt=[-1, 2])
        surrogate = httpx.post(f"{srv.base_url}/v1/completions", timeout=60, content=(
            '{"model": "%s", "prompt": "a\\ud800b", "max_tokens": 2}' % MODEL).encode(),
            headers={"content-type": "application/json"})
        results = [s.result(timeout=120) for s in streams]
    wrong = {kind: (r.status_code, r.text[:200]) for kind, r in answers.items() if r.status_code != 400}
    assert not wrong, wrong
    for kind, r in answers.items():
        body = r.json()
        validate("ErrorResponse", body)
        assert body["error"]["param"] == "lora_path" and "LoRA adapter" in body["error"]["message"], (kind, body)
    for r in (grammar, out_of_vocab, negative):
        assert r.status_code == 400, r.text
    assert surrogate.status_code < 500, surrogate.text  # a 200 (the text as UTF-8 can carry it) or a 400
    assert results == [(max_tokens, True)] * num_streams
    assert httpx.get(f"{srv.base_url}/health", timeout=10).status_code == 200
    assert complete(srv, MODEL).status_code == 200
    models = {c["id"] for c in httpx.get(f"{srv.base_url}/v1/models", timeout=10).json()["data"]}
    assert not any(m.startswith("broken-") for m in models)  # nothing half loaded


def test_a_reloaded_adapter_never_serves_kv_of_its_old_weights(srv, adapters):
    """Unload `x`, load other weights as `x`, send the same prompt: no cached token, and the text
    of the new weights (the old cache would give the old weights' K/V and another text)."""
    assert load(srv, "ref-b", adapters["b"]).status_code == 200  # the new weights' own text, for reference
    text_b = complete(srv, "ref-b").json()["choices"][0]["text"]
    assert unload(srv, "ref-b").status_code == 200
    assert load(srv, "x", adapters["a"]).status_code == 200
    first, again = complete(srv, "x").json(), complete(srv, "x").json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 32  # the cache is on, and hits
    text_a = first["choices"][0]["text"]
    assert text_a != text_b, "the two adapters must change the text differently for this test to mean anything"
    assert unload(srv, "x").status_code == 200
    assert load(srv, "x", adapters["b"]).status_code == 200
    reloaded = complete(srv, "x").json()
    assert reloaded["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert reloaded["choices"][0]["text"] == text_b
    assert unload(srv, "x").status_code == 200


def test_load_inplace_replaces_an_adapter_and_its_cache(srv, adapters):
    """vLLM's load_inplace: the same name, new weights, none of the old weights' blocks."""
    assert load(srv, "y", adapters["a"]).status_code == 200
    text_a = complete(srv, "y").json()["choices"][0]["text"]
    assert complete(srv, "y").json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 32
    refused = load(srv, "y", adapters["b"])
    assert refused.status_code == 400 and "already loaded" in refused.json()["error"]["message"]
    replaced = load(srv, "y", adapters["b"], load_inplace=True)
    assert replaced.status_code == 200, replaced.text
    after = complete(srv, "y").json()
    assert after["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert after["choices"][0]["text"] != text_a
    assert unload(srv, "y").status_code == 200


def test_a_request_larger_than_a_queue_bound_on_its_own_is_a_400_even_when_nothing_waits(srv):
    """prompts x n past every seat and the whole queue, or prompt tokens past the token bound, could
    never be admitted: refused at once with a 400 naming why (a 429 would only be retried)."""
    too_many = httpx.post(f"{srv.base_url}/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": [[5, 6, 7]] * 6, "n": 3, "max_tokens": 2})  # 18 > 8 seats + 8 queued
    assert too_many.status_code == 400, too_many.text
    body = too_many.json()
    validate("ErrorResponse", body)
    assert body["error"]["code"] == "request_too_large" and body["error"]["param"] == "n"
    assert "18 sequences" in body["error"]["message"] and "16" in body["error"]["message"]
    too_long = httpx.post(f"{srv.base_url}/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": [[5] * 250] * 9, "max_tokens": 2})  # 2,250 tokens > 2,048
    assert too_long.status_code == 400, too_long.text
    assert too_long.json()["error"]["code"] == "request_too_large"
    assert "2250 prompt tokens" in too_long.json()["error"]["message"]
    fits = httpx.post(f"{srv.base_url}/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": [[5, 6, 7]] * 4, "n": 4, "max_tokens": 2})  # 16: every seat and the queue
    assert fits.status_code == 200 and len(fits.json()["choices"]) == 16
