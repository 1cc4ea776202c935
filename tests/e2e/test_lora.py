"""End to end: `rill serve --enable-lora --lora-modules` with two PEFT adapters of the bundled model:
each request runs with the adapter its `model` names (greedy texts equal to PEFT's merged model),
requests for both adapters and the base share the engine, and /v1/models lists the adapters. A third
adapter is loaded and unloaded at runtime (--allow-runtime-lora-updating) through one of two API
workers, and the other worker serves it too."""
from __future__ import annotations

import concurrent.futures

import httpx
import pytest
import torch
from openai import NotFoundError, OpenAI

from rill.bench.features.lora_adapters import make_adapter
from tests.helpers.adapters import ADAPTERS
from tests.helpers.openapi import validate
from tests.helpers.server import sdk_client, start_server, stop_server

MODEL = "smollm2-135m-instruct"
NUM_NEW = 10
PROMPT = [1, 504, 3458, 282, 4063, 30, 2, 198]


@pytest.fixture(scope="module")
def adapters(model_dir, tokenizer, tmp_path_factory):
    """name -> (dir, the merged model's greedy text), for two of the model tests' adapters."""
    out = {}
    for seed, name in enumerate(["attn", "mlp", "all"]):
        path, merged = make_adapter(model_dir, tmp_path_factory.mktemp(name), *ADAPTERS[name], seed, b_std=0.15)
        with torch.inference_mode():
            ids = merged.generate(torch.tensor([PROMPT]), max_new_tokens=NUM_NEW, min_new_tokens=NUM_NEW,
                                  do_sample=False)[0, len(PROMPT):].tolist()
        out[name] = (path, tokenizer.decode(ids))
    return out


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory, adapters):
    srv = start_server(tmp_path_factory, "--dtype", "float32", "--max-model-len", "512", "--enable-lora",
                       "--max-loras", "3", "--allow-runtime-lora-updating", "--workers", "2",
                       "--lora-modules", *(f"{n}={adapters[n][0]}" for n in ("attn", "mlp")))
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def client(lora_server) -> OpenAI:
    return sdk_client(lora_server)


def test_models_lists_the_adapters_with_their_base_as_parent(lora_server, adapters):
    body = httpx.get(f"{lora_server.base_url}/v1/models").json()
    validate("ListModelsResponse", body)
    cards = {c["id"]: c for c in body["data"]}
    assert set(cards) == {MODEL, "attn", "mlp"}
    assert cards["attn"]["parent"] == MODEL and cards["attn"]["root"] == str(adapters["attn"][0])
    assert cards[MODEL]["parent"] is None
    one = httpx.get(f"{lora_server.base_url}/v1/models/mlp").json()
    validate("Model", one)
    assert one["parent"] == MODEL


def test_each_request_runs_with_the_adapter_its_model_names(client, adapters):
    def complete(model):
        r = client.completions.create(model=model, prompt=PROMPT, max_tokens=NUM_NEW, temperature=0,
                                      extra_body={"min_tokens": NUM_NEW})
        assert r.model == model
        return r.choices[0].text

    names = ["attn", "mlp", MODEL, "attn", "mlp", MODEL]
    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:  # in the engine's batches together
        texts = list(pool.map(complete, names))
    base = texts[2]
    for name, text in zip(names, texts):
        assert text == (adapters[name][1] if name != MODEL else base), name
    assert len({adapters["attn"][1], adapters["mlp"][1], base}) == 3  # each adapter changes the text


def test_chat_with_an_adapter_and_an_unknown_model(client):
    r = client.chat.completions.create(model="attn", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert r.model == "attn" and r.choices[0].message.content is not None
    with pytest.raises(NotFoundError) as exc:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert exc.value.body["code"] == "model_not_found" and exc.value.body["param"] == "model"


def test_every_generating_route_resolves_an_adapter_the_same_way(lora_server, client):
    """Responses and Messages run the adapter their `model` names, as chat does (one resolution for every route);
    the answer names the adapter; /tokenize takes its name; embeddings, of the served model only, do not."""
    import anthropic

    ask = [{"role": "user", "content": "Name a colour."}]
    chat = {m: client.chat.completions.create(model=m, messages=ask, max_tokens=8, temperature=0)
            for m in ("attn", MODEL)}
    assert chat["attn"].choices[0].message.content != chat[MODEL].choices[0].message.content
    response = client.responses.create(model="attn", input=ask, max_output_tokens=8, temperature=0)
    assert response.model == "attn" and response.output_text == chat["attn"].choices[0].message.content
    claude = anthropic.Anthropic(base_url=lora_server.base_url, api_key="x", _strict_response_validation=True,
                                 max_retries=0, timeout=120)
    message = claude.messages.create(model="attn", messages=ask, max_tokens=8, extra_body={"temperature": 0})
    assert message.model == "attn" and message.content[0].text == chat["attn"].choices[0].message.content
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="nope", messages=ask, max_tokens=8)
    assert httpx.post(f"{lora_server.base_url}/tokenize", json={"model": "attn", "prompt": "Hi"}).status_code == 200
    r = httpx.post(f"{lora_server.base_url}/v1/embeddings", json={"model": "attn", "input": "Hi"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model", r.text


def test_an_adapter_loaded_and_unloaded_at_runtime(lora_server, adapters, tmp_path):
    url = lora_server.base_url

    def complete(model):  # a new connection each time: either of the two workers answers
        return httpx.post(f"{url}/v1/completions", timeout=120, json={
            "model": model, "prompt": PROMPT, "max_tokens": NUM_NEW, "temperature": 0, "min_tokens": NUM_NEW})

    assert complete("all").status_code == 404
    # Errors name the parameter: a path that is no adapter, a field missing.
    bad = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": str(tmp_path)})
    assert bad.status_code == 400 and "not a PEFT adapter directory" in bad.json()["error"]["message"]
    missing = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "x"})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "lora_path"
    r = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "all", "lora_path": str(adapters["all"][0])})
    assert r.status_code == 200 and "added successfully" in r.text
    for _ in range(4):
        r = complete("all")
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == adapters["all"][1]
    assert "all" in {c["id"] for c in httpx.get(f"{url}/v1/models").json()["data"]}
    # The same name twice, a slot too many.
    again = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "all", "lora_path": str(adapters["all"][0])})
    assert again.status_code == 400 and "already loaded" in again.json()["error"]["message"]
    full = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": str(adapters["all"][0])})
    assert full.status_code == 400 and "--max-loras 3" in full.json()["error"]["message"]
    r = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "all"})
    assert r.status_code == 200 and "removed successfully" in r.text
    for _ in range(4):  # a worker that still knew it gets the engine's refusal: a 404 too
        r = complete("all")
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
    gone = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "all"})
    assert gone.status_code == 404
