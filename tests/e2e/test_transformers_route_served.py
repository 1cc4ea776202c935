"""End to end: a family with no native implementation (a tiny random-weight Gemma 3: sliding and
global layers, queries scaled by query_pre_attn_scalar) served by `rill serve` at its defaults on the
paged transformers route, through the OpenAI SDK: prompt logprobs and greedy tokens are transformers'
own, and a shared prefix is served from the KV cache."""
from __future__ import annotations

import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from rill.bench.serving.tiny_model import TOKENIZER_FILE_NAMES
from tests.helpers.http_calls import post
from tests.helpers.server import sdk_client, start_server, stop_server
from tests.helpers.tiny_models import WINDOW, tiny_config

MODEL = "tiny-gemma3"
TEXT = ("The keeper of the lighthouse wrote in his log, every night for forty years, what the sea had done "
        "that day and what the ships had signalled as they passed the rocks below the tower.")


@pytest.fixture(scope="module")
def gemma(model_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma3")
    config = tiny_config("gemma3_text")
    config.vocab_size = 49152  # the bundled tokenizer's
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for param in hf.parameters():
            param.normal_(0.0, 0.2)
    hf.save_pretrained(path)
    for name in TOKENIZER_FILE_NAMES:
        if (model_dir / name).is_file() and name != "generation_config.json":
            shutil.copyfile(model_dir / name, path / name)
    srv = start_server(tmp_path_factory, "--model", str(path), "--served-model-name", MODEL, "--dtype", "float32",
                       "--log-level", "info")
    yield hf, srv
    stop_server(srv)


def test_it_runs_on_the_paged_route_with_prefix_caching(gemma):
    log = gemma[1].log()
    assert "transformers' model over the paged KV cache (no native implementation" in log
    assert "prefix caching on" in log and "transformers runner on cpu" in log


def test_prompt_logprobs_are_transformers_own(gemma, tokenizer):
    hf, srv = gemma
    ids = tokenizer.encode(TEXT).ids
    assert len(ids) > 2 * WINDOW  # the sliding layers' window matters
    r = post(srv, "/v1/completions", {"model": MODEL, "prompt": TEXT, "max_tokens": 0, "echo": True, "logprobs": 1})
    assert r.status_code == 200, r.text
    got = r.json()["choices"][0]["logprobs"]["token_logprobs"]
    with torch.inference_mode():
        logprobs = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)
    want = [None] + [float(logprobs[i - 1, ids[i]]) for i in range(1, len(ids))]
    assert got[0] is None
    assert got[1:] == pytest.approx(want[1:], abs=1e-3)


def test_greedy_tokens_are_transformers_own(gemma, tokenizer):
    hf, srv = gemma
    ids = tokenizer.encode(TEXT).ids
    resp = sdk_client(srv).completions.create(model=MODEL, prompt=ids, max_tokens=24, temperature=0, logprobs=1,
                                              extra_body={"ignore_eos": True})
    with torch.inference_mode():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=24, min_new_tokens=24, do_sample=False, pad_token_id=0)
    expected = [tokenizer.decode([t], skip_special_tokens=False) for t in out[0, len(ids):].tolist()]
    assert resp.choices[0].logprobs.tokens == expected and resp.usage.completion_tokens == 24


def test_a_shared_prefix_is_served_from_the_cache(gemma, tokenizer):
    _, srv = gemma
    ids = tokenizer.encode(TEXT.upper()).ids  # a prefix no earlier test sent
    client = sdk_client(srv)
    first = client.completions.create(model=MODEL, prompt=ids + [1000], max_tokens=8, temperature=0)
    second = client.completions.create(model=MODEL, prompt=ids + [2000], max_tokens=8, temperature=0)
    assert first.usage.prompt_tokens_details is None or not first.usage.prompt_tokens_details.cached_tokens
    assert second.usage.prompt_tokens_details.cached_tokens == len(ids) // 16 * 16
