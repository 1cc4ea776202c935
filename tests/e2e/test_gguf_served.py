"""`rill serve --model FILE.gguf`: a GGUF file the test writes (tests/helpers/gguf_files.py), served
under its file's name, with its own chat template and its general.sampling.* defaults, giving
transformers' greedy tokens on the converted weights."""
from __future__ import annotations

import gguf
import httpx
import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

from tests.helpers.gguf_files import tiny_model, write_gguf
from tests.helpers.server import sdk_client, start_server, stop_server

NAME = "tiny.Q8_0.gguf"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf")
    # its author's defaults: greedy (as a request that leaves temperature out gets), and top_k 40
    path = write_gguf(tiny_model(), folder / NAME, gguf.GGMLQuantizationType.Q8_0, sampling={"temp": 0.0, "top_k": 40})
    cache = folder / "cache"
    srv = start_server(tmp_path_factory, "--model", str(path), "--cache-dir", str(cache), "--dtype", "float32")
    yield srv, next(p for p in (cache / "gguf").iterdir() if p.is_dir() and not p.name.startswith("."))
    stop_server(srv)


def test_it_is_served_under_the_files_name(served):
    srv, _ = served
    models = httpx.get(f"{srv.base_url}/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == [NAME]


def test_greedy_tokens_are_transformers_own_on_the_converted_weights(served):
    srv, converted = served
    prompt = [1, 504, 3325, 314, 253, 1200]
    resp = sdk_client(srv).completions.create(model=NAME, prompt=prompt, max_tokens=12, temperature=0, logprobs=1,
                                              extra_body={"ignore_eos": True})
    hf = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32).eval()
    with torch.inference_mode():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=12, min_new_tokens=12, do_sample=False,
                          pad_token_id=0)
    tokenizer = Tokenizer.from_file(str(converted / "tokenizer.json"))
    expected = [tokenizer.decode([t], skip_special_tokens=False) for t in out[0, len(prompt):].tolist()]
    assert resp.usage.completion_tokens == 12 and resp.choices[0].logprobs.tokens == expected


def test_its_general_sampling_fields_are_the_defaults_of_a_request_that_leaves_them_out(served):
    srv, _ = served
    assert httpx.get(f"{srv.base_url}/stats", timeout=10).json()["sampling_defaults"] == {"temperature": 0.0,
                                                                                         "top_k": 40}
    prompt = [1, 504, 3325, 314, 253, 1200]
    client = sdk_client(srv)
    greedy = client.completions.create(model=NAME, prompt=prompt, max_tokens=12, temperature=0,
                                       extra_body={"ignore_eos": True}).choices[0].text
    # no temperature: the file's 0, whatever the seed; a request's own temperature still wins
    for seed in (1, 2):
        text = client.completions.create(model=NAME, prompt=prompt, max_tokens=12, seed=seed,
                                         extra_body={"ignore_eos": True}).choices[0].text
        assert text == greedy
    sampled = {client.completions.create(model=NAME, prompt=prompt, max_tokens=12, seed=seed, temperature=1.5,
                                         extra_body={"ignore_eos": True, "top_k": 0}).choices[0].text
               for seed in (1, 2, 3)}
    assert sampled != {greedy}


def test_chat_uses_the_files_own_template(served):
    srv, _ = served
    resp = sdk_client(srv).chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Hi"}],
                                                   max_tokens=4)
    # SmolLM2's template: "<|im_start|>system\n...<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert resp.usage.prompt_tokens > 10 and resp.choices[0].message.role == "assistant"
