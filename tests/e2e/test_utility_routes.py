"""vLLM's /tokenize, /detokenize and /version, and the /v3 alias of /v1, through a real `rill serve`."""
from __future__ import annotations

from importlib.metadata import version

import httpx
import openai
import pytest

from tests.helpers.openapi import validate

MODEL = "smollm2-135m-instruct"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]


def post(server, path: str, body) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, timeout=60)


def test_tokenize_a_prompt_as_the_tokenizer_does(server, tokenizer):
    text = "Héllo, wörld! 🌊"
    got = post(server, "/tokenize", {"model": MODEL, "prompt": text, "return_token_strs": True}).json()
    expected = tokenizer.encode(text, add_special_tokens=True).ids
    assert got["tokens"] == expected and got["count"] == len(expected)
    assert got["max_model_len"] == 2048
    assert got["token_strs"] == [tokenizer.id_to_token(i) for i in expected]
    bare = post(server, "/tokenize", {"prompt": text, "add_special_tokens": False}).json()
    assert bare["tokens"] == tokenizer.encode(text, add_special_tokens=False).ids
    assert bare["token_strs"] is None


def test_llama_cpps_spellings(server, tokenizer):
    """llama.cpp's /tokenize body (`content`, `with_pieces`) and /detokenize answer (`content`)."""
    text = "Héllo, wörld! 🌊"
    got = post(server, "/tokenize", {"content": text, "with_pieces": True}).json()
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert [t["id"] for t in got["tokens"]] == ids and got["count"] == len(ids)
    pieces = [t["piece"] for t in got["tokens"]]
    assert b"".join(p.encode() if isinstance(p, str) else bytes(p) for p in pieces) == text.encode()
    assert any(isinstance(p, list) for p in pieces)  # the wave's bytes, split over tokens
    back = post(server, "/detokenize", {"tokens": ids}).json()
    assert back["content"] == back["prompt"] == text
    for body in ({"prompt": text, "content": text}, {"add_special": True}):
        r = post(server, "/tokenize", body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text


def test_tokenize_messages_counts_what_chat_sends(server, client):
    got = post(server, "/tokenize", {"model": MODEL, "messages": MESSAGES}).json()
    usage = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1).usage
    assert got["count"] == usage.prompt_tokens == len(got["tokens"])
    without_prompt = post(server, "/tokenize", {"messages": MESSAGES, "add_generation_prompt": False}).json()
    assert without_prompt["count"] < got["count"]
    assert got["tokens"][:without_prompt["count"]] == without_prompt["tokens"]


def test_detokenize_round_trips(server, tokenizer):
    text = "The sea is calm tonight. 🌊"
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert post(server, "/detokenize", {"model": MODEL, "tokens": ids}).json() == {"prompt": text, "content": text}
    assert post(server, "/detokenize", {"tokens": []}).json() == {"prompt": "", "content": ""}


@pytest.mark.parametrize("path,body,status,param", [
    ("/tokenize", {"prompt": 5}, 400, "prompt"),
    ("/tokenize", {}, 400, "prompt"),
    ("/tokenize", {"prompt": "x", "model": "other"}, 404, "model"),
    ("/tokenize", {"messages": []}, 400, "messages"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens[0]"),
    ("/detokenize", {"tokens": [1, 10**9]}, 400, "tokens[1]"),
    ("/detokenize", {"tokens": "12"}, 400, "tokens"),
    ("/detokenize", {"tokens": [1], "model": "other"}, 404, "model"),
])
def test_bad_utility_requests(server, path, body, status, param):
    resp = post(server, path, body)
    assert resp.status_code == status, resp.text
    validate("ErrorResponse", resp.json())
    assert resp.json()["error"]["param"] == param


def test_version_is_the_package_version(server):
    assert httpx.get(f"{server.base_url}/version").json() == {"version": version("rill")}


def test_v3_is_an_alias_of_v1(server):
    v3 = openai.OpenAI(base_url=f"{server.base_url}/v3", api_key="unused", _strict_response_validation=True,
                       max_retries=0, timeout=60)
    assert [m.id for m in v3.models.list()] == [MODEL]
    assert v3.models.retrieve(MODEL).id == MODEL
    chat = v3.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, temperature=0)
    assert chat.choices[0].finish_reason in ("stop", "length") and chat.usage.completion_tokens >= 1
    chunks = list(v3.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    text = v3.completions.create(model=MODEL, prompt="One, two,", max_tokens=3, temperature=0)
    assert text.choices[0].text and text.usage.completion_tokens == 3
    assert httpx.get(f"{server.base_url}/v3/nothing").status_code == 404
    assert httpx.get(f"{server.base_url}/v2/models").status_code == 404
