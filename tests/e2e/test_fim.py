"""Fill-in-the-middle: `suffix` on /v1/completions, through a real `rill serve` and the strict OpenAI SDK.

The bundled model's tokenizer has no FIM tokens; the tests' copy renames three of its unused special tokens
(<repo_name>, <reponame>, <file_sep>: ids 3, 4, 5) to StarCoder's <fim_prefix>, <fim_suffix>, <fim_middle>,
the same weights behind them. A FIM request must generate what a plain one does on the prompt laid out in
those tokens by hand (greedy).
"""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.helpers.openapi import validate
from tests.helpers.server import sdk_client, start_server, stop_server

FIM_NAMES = {3: "<fim_prefix>", 4: "<fim_suffix>", 5: "<fim_middle>"}
PREFIX, SUFFIX = "def add(a, b):\n", "\n\nprint(add(1, 2))\n"


@pytest.fixture(scope="module")
def fim_dir(model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("fim-model")
    for f in model_dir.iterdir():
        if f.name != "tokenizer.json" and f.is_file():
            (out / f.name).symlink_to(f)
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    for added in tok["added_tokens"]:
        if added["id"] in FIM_NAMES:
            old, added["content"] = added["content"], FIM_NAMES[added["id"]]
            tok["model"]["vocab"][added["content"]] = tok["model"]["vocab"].pop(old)
    (out / "tokenizer.json").write_text(json.dumps(tok))
    return out


@pytest.fixture(scope="module")
def fim_server(fim_dir, tmp_path_factory):
    srv = start_server(tmp_path_factory, "--model", str(fim_dir), "--served-model-name", "fim",
                       "--max-model-len", "512")
    yield srv
    stop_server(srv)


def by_hand(tokenizer, prefix: str, suffix: str) -> list[int]:
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    return [3, *encode(prefix), 4, *encode(suffix), 5]


def test_suffix_fills_the_middle_in_the_models_fim_tokens(fim_server, tokenizer):
    sdk = sdk_client(fim_server)
    body = dict(model="fim", max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    filled = sdk.completions.create(prompt=PREFIX, suffix=SUFFIX, **body)
    plain = sdk.completions.create(prompt=by_hand(tokenizer, PREFIX, SUFFIX), **body)
    assert filled.choices[0].text == plain.choices[0].text and filled.choices[0].text
    assert filled.usage.prompt_tokens == len(by_hand(tokenizer, PREFIX, SUFFIX))
    # (not strict: the SDK's Completion type has no null finish_reason, which every chunk but the last has)
    loose = openai.OpenAI(base_url=f"{fim_server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    streamed = "".join(c.choices[0].text for c in loose.completions.create(prompt=PREFIX, suffix=SUFFIX, stream=True,
                                                                            **body) if c.choices)
    assert streamed == plain.choices[0].text
    # a batch of prefixes, token ids as a prefix, an empty prefix (the cursor at the top of the file)
    batch = sdk.completions.create(prompt=[PREFIX, "x = 1\n"], suffix=SUFFIX, **body)
    assert batch.choices[0].text == plain.choices[0].text
    ids = sdk.completions.create(prompt=tokenizer.encode(PREFIX, add_special_tokens=False).ids, suffix=SUFFIX, **body)
    assert ids.choices[0].text == plain.choices[0].text
    top = sdk.completions.create(prompt="", suffix=SUFFIX, **body)
    assert top.choices[0].text == sdk.completions.create(prompt=by_hand(tokenizer, "", SUFFIX), **body).choices[0].text
    raw = httpx.post(f"{fim_server.base_url}/v1/completions", json={"model": "fim", "prompt": PREFIX, "suffix": SUFFIX,
                                                                    "max_tokens": 2}, timeout=60)
    validate("CreateCompletionResponse", raw.json())


def test_what_fill_in_the_middle_refuses(fim_server, server):
    sdk = sdk_client(fim_server)
    with pytest.raises(openai.BadRequestError) as err:
        sdk.completions.create(model="fim", prompt=PREFIX, suffix=SUFFIX, echo=True, max_tokens=2)
    assert err.value.body["param"] == "suffix"
    plain = sdk_client(server)  # the bundled model: no FIM tokens
    with pytest.raises(openai.BadRequestError) as err:
        plain.completions.create(model="smollm2-135m-instruct", prompt=PREFIX, suffix=SUFFIX, max_tokens=2)
    assert err.value.body["param"] == "suffix" and "fill-in-the-middle" in err.value.body["message"]
    # an empty suffix (editors send one at the end of a file) is a plain completion there
    assert plain.completions.create(model="smollm2-135m-instruct", prompt=PREFIX, suffix="", max_tokens=2).choices


def test_infill_lays_out_the_context_and_answers_in_llama_cpps_shape(fim_server, server, tokenizer):
    """llama.cpp's /infill: other files' chunks (this tokenizer has no file separator: each after a snippet line),
    then PRE prefix SUF suffix MID, then `prompt`; greedy, the same text as a plain completion of those ids."""
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "prompt": "    ", "n_predict": 6, "temperature": 0,
            "ignore_eos": True,
            "input_extra": [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}],
            "cache_prompt": True, "samplers": ["top_k"]}  # llama.cpp's fields this server does not read: ignored
    ids = [*encode("\n\n--- snippet ---\n\n"), *encode(body["input_extra"][0]["text"]),
           *by_hand(tokenizer, PREFIX, SUFFIX), *encode("    ")]
    plain = sdk_client(fim_server).completions.create(model="fim", prompt=ids, max_tokens=6, temperature=0,
                                                       extra_body={"ignore_eos": True})
    r = httpx.post(f"{fim_server.base_url}/infill", json=body, timeout=60)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["content"] == plain.choices[0].text and answer["stop"] is True
    assert answer["tokens_evaluated"] == len(ids) and answer["tokens_predicted"] == 6
    assert answer["stop_type"] == "limit" and answer["timings"]["predicted_n"] == 6
    with httpx.stream("POST", f"{fim_server.base_url}/infill", json={**body, "stream": True}, timeout=60) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    assert "".join(e["content"] for e in events) == answer["content"]
    assert [e["stop"] for e in events] == [False] * (len(events) - 1) + [True]
    for n_predict in (-2, 10**9):  # below -1; past the context
        bad = httpx.post(f"{fim_server.base_url}/infill", json={**body, "n_predict": n_predict}, timeout=60)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "n_predict", bad.text
    none = httpx.post(f"{server.base_url}/infill", json=body, timeout=60)  # the bundled model: no FIM tokens
    assert none.status_code == 400 and "fill-in-the-middle" in none.json()["error"]["message"]
