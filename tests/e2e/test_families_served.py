"""End to end: families on the paged transformers route served by `rill serve`, through the OpenAI SDK, their greedy
tokens and prompt logprobs transformers' own. A tiny random-weight Gemma 4 checkpoint (Gemma4ForConditionalGeneration:
the text model beside a vision tower; wider global layers with one K/V head, per-layer input embeddings, layers
reusing others' K/V) served for its text; a tiny Qwen3.5 (Gated DeltaNet layers, a state per request, beside full
attention), several requests at once."""
from __future__ import annotations

import pytest
import torch

from tests.helpers.http_calls import post
from tests.helpers.server import sdk_client, start_server, stop_server
from tests.helpers.tiny_models import save_random_model, tiny_config

MODEL = "tiny"
TEXT = "The keeper of the lighthouse wrote in his log, every night for forty years, what the sea had done that day."
VOCAB = 49152  # the bundled tokenizer's


@pytest.fixture(scope="module")
def gemma4(model_dir, tmp_path_factory):
    config = tiny_config("gemma4")
    config.text_config.vocab_size = config.text_config.vocab_size_per_layer_input = VOCAB
    for i, name in enumerate(("boi_token_id", "eoi_token_id", "image_token_id", "video_token_id", "boa_token_id",
                              "eoa_token_index", "audio_token_id")):
        setattr(config, name, VOCAB - 1 - i)  # ids the prompts never hold
    path = tmp_path_factory.mktemp("gemma4")
    hf = save_random_model(config, path, tokenizer_dir=model_dir)
    assert type(hf).__name__ == "Gemma4ForConditionalGeneration"  # the checkpoints' class
    srv = start_server(tmp_path_factory, "--model", str(path), "--served-model-name", MODEL, "--dtype", "float32",
                       "--enforce-eager", "--log-level", "info")
    yield hf, srv
    stop_server(srv)


def test_greedy_tokens_and_prompt_logprobs_are_transformers_own(gemma4, tokenizer):
    hf, srv = gemma4
    assert "transformers' model over the paged KV cache" in srv.log()
    ids = tokenizer.encode(TEXT).ids
    resp = sdk_client(srv).completions.create(model=MODEL, prompt=ids, max_tokens=20, temperature=0, logprobs=1,
                                              extra_body={"ignore_eos": True})
    with torch.inference_mode():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=20, min_new_tokens=20, do_sample=False, pad_token_id=0)
        logprobs = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)
    expected = [tokenizer.decode([t], skip_special_tokens=False) for t in out[0, len(ids):].tolist()]
    assert resp.choices[0].logprobs.tokens == expected and resp.usage.completion_tokens == 20
    r = post(srv, "/v1/completions", {"model": MODEL, "prompt": TEXT, "max_tokens": 0, "echo": True, "logprobs": 1})
    assert r.status_code == 200, r.text
    want = [float(logprobs[i - 1, ids[i]]) for i in range(1, len(ids))]
    assert r.json()["choices"][0]["logprobs"]["token_logprobs"][1:] == pytest.approx(want, abs=1e-3)


@pytest.fixture(scope="module")
def qwen3_5(model_dir, tmp_path_factory):
    config = tiny_config("qwen3_5_text")
    config.vocab_size = VOCAB
    path = tmp_path_factory.mktemp("qwen3_5")
    hf = save_random_model(config, path, tokenizer_dir=model_dir)
    srv = start_server(tmp_path_factory, "--model", str(path), "--served-model-name", MODEL, "--dtype", "float32",
                       "--log-level", "info", "--max-num-batched-tokens", "16")
    yield hf, srv
    stop_server(srv)


def test_linear_attention_states_carry_over_chunks_and_steps_of_concurrent_requests(qwen3_5, tokenizer):
    """Three prompts at once, each cut into chunks of the 16-token budget beside the others' decodes: every
    request's greedy tokens are transformers' own, its states its own."""
    from concurrent.futures import ThreadPoolExecutor

    hf, srv = qwen3_5
    log = srv.log()
    assert "prefix caching off: a linear-attention layer's state at a cached prefix is not kept" in log
    prompts = [tokenizer.encode(text).ids for text in (TEXT, TEXT.upper(), "Tides, " + TEXT[::-1])]
    client = sdk_client(srv)

    def complete(ids):
        return client.completions.create(model=MODEL, prompt=ids, max_tokens=12, temperature=0, logprobs=1,
                                         extra_body={"ignore_eos": True}).choices[0].logprobs.tokens

    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(complete, prompts))
    for ids, tokens in zip(prompts, answers):
        with torch.inference_mode():
            out = hf.generate(torch.tensor([ids]), max_new_tokens=12, min_new_tokens=12, do_sample=False,
                              pad_token_id=0)
        assert tokens == [tokenizer.decode([t], skip_special_tokens=False) for t in out[0, len(ids):].tolist()]
