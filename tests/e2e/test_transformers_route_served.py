"""End to end: families with no native implementation served by `rill serve` at its defaults on the
paged transformers route, through the OpenAI SDK. A tiny random-weight Gemma 3 (sliding and global
layers, queries scaled by query_pre_attn_scalar): prompt logprobs and greedy tokens are
transformers' own, and a shared prefix is served from the KV cache. A tiny Mistral with a window:
on a long generation it holds its window of KV blocks, as /stats shows; so do Gemma 3's sliding layers,
in a pool of their own, while its global layers hold every block."""
from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
import torch

from tests.helpers.http_calls import post
from tests.helpers.server import sdk_client, start_server, stats, stop_server
from tests.helpers.tiny_models import WINDOW, save_random_model, tiny_config

MODEL = "tiny-gemma3"
TEXT = ("The keeper of the lighthouse wrote in his log, every night for forty years, what the sea had done "
        "that day and what the ships had signalled as they passed the rocks below the tower.")


def save_servable(kind: str, model_dir, tmp_path_factory, **overrides):
    """A tiny random-weight model of `kind` with the bundled tokenizer, saved: (hf model, its directory)."""
    path = tmp_path_factory.mktemp(kind)
    config = tiny_config(kind)
    config.vocab_size = 49152  # the bundled tokenizer's
    for name, value in overrides.items():
        setattr(config, name, value)
    return save_random_model(config, path, tokenizer_dir=model_dir), path


@pytest.fixture(scope="module")
def gemma(model_dir, tmp_path_factory):
    """(the model, its server, its directory, the merged model of the LoRA adapter `tuned` it serves too)."""
    from rill.bench.features.lora_adapters import make_adapter

    hf, path = save_servable("gemma3_text", model_dir, tmp_path_factory)
    adapter, merged = make_adapter(path, tmp_path_factory.mktemp("tuned"), 4, 8, ["q_proj", "v_proj", "down_proj"], 3,
                                   b_std=1.0)
    srv = start_server(tmp_path_factory, "--model", str(path), "--served-model-name", MODEL, "--dtype", "float32",
                       "--log-level", "info", "--enable-lora", "--lora-modules", f"tuned={adapter}",
                       "--max-lora-rank", "8")
    yield hf, srv, path, merged
    stop_server(srv)


def test_a_lora_adapter_on_the_route_gives_the_merged_models_logprobs(gemma, tokenizer):
    """`tuned`, a PEFT adapter of the tiny Gemma 3, served by name beside the base model: its prompt logprobs are
    PEFT's merged model's, and the base model's stay its own."""
    hf, srv, _, merged = gemma
    ids = tokenizer.encode(TEXT).ids
    for name, model in (("tuned", merged), (MODEL, hf)):
        r = post(srv, "/v1/completions", {"model": name, "prompt": TEXT, "max_tokens": 1, "echo": True,
                                          "logprobs": 0})
        assert r.status_code == 200, r.text
        with torch.inference_mode():
            logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
        want = [float(logprobs[i - 1, ids[i]]) for i in range(1, len(ids))]
        assert r.json()["choices"][0]["logprobs"]["token_logprobs"][1:len(ids)] == pytest.approx(want, abs=1e-3), name
    assert "tuned" in [m.id for m in sdk_client(srv).models.list().data]


def test_it_runs_on_the_paged_route_with_prefix_caching(gemma):
    log = gemma[1].log()
    assert "transformers' model over the paged KV cache (no native implementation" in log
    assert "prefix caching on" in log and "transformers runner on cpu" in log


def test_prompt_logprobs_are_transformers_own(gemma, tokenizer):
    hf, srv, *_ = gemma
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
    hf, srv, *_ = gemma
    ids = tokenizer.encode(TEXT).ids
    resp = sdk_client(srv).completions.create(model=MODEL, prompt=ids, max_tokens=24, temperature=0, logprobs=1,
                                              extra_body={"ignore_eos": True})
    with torch.inference_mode():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=24, min_new_tokens=24, do_sample=False, pad_token_id=0)
    expected = [tokenizer.decode([t], skip_special_tokens=False) for t in out[0, len(ids):].tolist()]
    assert resp.choices[0].logprobs.tokens == expected and resp.usage.completion_tokens == 24


def test_a_grammar_drafts_what_it_forces_on_the_route(gemma):
    """Jump-forward (and so predicted outputs and n-grams: drafts) on the paged route: a choice of one text forces
    all of it, drafted and verified; the answer is that text (tests/model/test_transformers_route.py checks every
    draft's row against transformers)."""
    _, srv, *_ = gemma
    before = stats(srv)["num_jump_forward_tokens"]
    choice = "the keeper of the lighthouse wrote in his log every night"
    r = post(srv, "/v1/completions", {"model": MODEL, "prompt": TEXT, "max_tokens": 40, "temperature": 0,
                                      "structured_outputs": {"choice": [choice]}})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == choice, r.text
    assert stats(srv)["num_jump_forward_tokens"] > before


def test_a_shared_prefix_is_served_from_the_cache(gemma, tokenizer):
    _, srv, *_ = gemma
    ids = tokenizer.encode(TEXT.upper()).ids  # a prefix no earlier test sent
    client = sdk_client(srv)
    first = client.completions.create(model=MODEL, prompt=ids + [1000], max_tokens=8, temperature=0)
    second = client.completions.create(model=MODEL, prompt=ids + [2000], max_tokens=8, temperature=0)
    assert first.usage.prompt_tokens_details is None or not first.usage.prompt_tokens_details.cached_tokens
    assert second.usage.prompt_tokens_details.cached_tokens == len(ids) // 16 * 16


def blocks_used_in_a_long_generation(srv, max_tokens: int) -> tuple[list[tuple[int, int, int, int]], int, int]:
    """(tokens streamed before the query, requests running, blocks held, of those the sliding layers' window tables
    hold) from /stats every few ms during one streamed greedy generation of max_tokens; its prompt and total token
    counts. The engine runs ahead of the stream: while it runs, the sequence is at least prompt + that many tokens."""
    used, done, streamed = [], threading.Event(), [0]

    def poll():
        while not done.is_set():
            seen = streamed[0]
            s = stats(srv)
            used.append((seen, s["num_running"], s["num_total_blocks"] - s["num_free_blocks"], s["num_window_blocks"]))
            time.sleep(0.005)

    poller = threading.Thread(target=poll)
    usage = None
    body = {"model": MODEL, "prompt": TEXT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    try:
        poller.start()
        with httpx.stream("POST", f"{srv.base_url}/v1/completions", json=body, timeout=120) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[len("data: "):])
                    streamed[0] += bool(chunk["choices"] and chunk["choices"][0]["text"])  # a token or more a chunk
                    usage = chunk.get("usage") or usage
    finally:
        done.set()
        poller.join()
    assert usage["completion_tokens"] == max_tokens
    return used, usage["prompt_tokens"], usage["prompt_tokens"] + usage["completion_tokens"]


def test_gemma3s_sliding_layers_hold_their_window_and_its_global_layers_every_block(gemma):
    """The tiny Gemma 3's window is 16 tokens, a block at the default block size: its sliding layers'
    window table holds the block of their window and the one being written; the global layers' table
    every block of the sequence, all from the one pool."""
    srv = gemma[1]
    assert "(the sliding layers in 1 window table(s) a request)" in srv.log()
    used, num_prompt, num_tokens = blocks_used_in_a_long_generation(srv, 200)
    assert num_tokens > 14 * 16
    during = [(seen, total, window) for seen, running, total, window in used if seen and running]
    assert during, used
    # the global layers hold a block for every 16 tokens of the sequence so far (a shared prefix cached earlier
    # may be among them), more than the window tables' two
    for seen, total, window in during:
        assert total - window >= (num_prompt + seen) // 16, used
    assert max(total - window for _, total, window in during) > 2, used
    assert 0 < max(window for _, _, window in during) <= 2, used


def test_a_request_longer_than_one_table_could_hold_is_served_with_transformers_tokens(gemma, model_dir, tokenizer,
                                                                                      tmp_path_factory):
    """A cache of 24 blocks of the tiny Gemma 3's one global layer: one table for both layers would
    hold 11 blocks (176 tokens) of a request; with window tables, a 240-token generation runs, and its
    greedy tokens are transformers' own."""
    from rill.engine_proc.attention.kv_layout import bytes_per_block

    hf = gemma[0]
    memory = 24 * bytes_per_block(hf.config, torch.float32, 16, num_layers=1)
    assert memory // bytes_per_block(hf.config, torch.float32, 16) - 1 == 11
    srv = start_server(tmp_path_factory, "--model", str(gemma[2]), "--served-model-name", MODEL, "--dtype",
                       "float32", "--kv-cache-memory", str(memory), "--max-num-batched-tokens", "64")
    try:
        ids = tokenizer.encode(TEXT).ids
        resp = sdk_client(srv).completions.create(model=MODEL, prompt=ids, max_tokens=240 - len(ids), temperature=0,
                                                  logprobs=1, extra_body={"ignore_eos": True})
    finally:
        stop_server(srv)
    with torch.inference_mode():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=240 - len(ids), min_new_tokens=240 - len(ids),
                          do_sample=False, pad_token_id=0)
    expected = [tokenizer.decode([t], skip_special_tokens=False) for t in out[0, len(ids):].tolist()]
    assert resp.choices[0].logprobs.tokens == expected


def test_a_model_whose_every_layer_slides_holds_its_window_of_kv_blocks(model_dir, tmp_path_factory, tokenizer):
    _, path = save_servable("mistral-window", model_dir, tmp_path_factory, sliding_window=32,
                           max_position_embeddings=1024)
    srv = start_server(tmp_path_factory, "--model", str(path), "--served-model-name", MODEL, "--block-size", "16")
    try:
        # long enough to be seen running: the tiny model's 240 tokens once took two polls of /stats
        used, _, num_tokens = blocks_used_in_a_long_generation(srv, 900)
    finally:
        stop_server(srv)
    assert num_tokens > 56 * 16
    during = [u for u in used if u[1]]
    # the window's two blocks and the one being written, never the 57 its tokens span; no pool of its own
    assert during and 0 < max(u[2] for u in during) <= 3 and max(u[3] for u in during) == 0, used
