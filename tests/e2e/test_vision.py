"""End to end: images in chat completions (docs/vision.md), a tiny random LLaVA, Qwen2.5-VL and Gemma 3 served in
float32 (the other families' prompts are checked in tests/model/test_vision_route.py). With the OpenAI SDK: the greedy
tokens are transformers' own generate over the same prompt ids and the processor's pixels, for a PNG and for a JPEG
beside it, whole and streamed; the same text with the same image is a prefix-cache hit and with another image is
not; and every bad image is a 400 naming its part, the server serving on after."""
from __future__ import annotations

import base64
import io
import json

import httpx
import pytest
import torch

from tests.helpers.http_calls import check_error
from tests.helpers.server import launch_server, sdk_client, start_server, start_servers, stop_server
from tests.helpers.tiny_vision import KINDS, TOKENS_PER_IMAGE, data_url, forward_kwargs, image, save_tiny_vlm

MODEL = "tiny-vlm"
NEW_TOKENS = 8
IDS = {"return_token_ids": True, "ignore_eos": True}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    dirs = {kind: tmp_path_factory.mktemp(kind) for kind in KINDS}
    for kind, path in dirs.items():
        save_tiny_vlm(kind, path)
    return dirs


@pytest.fixture(scope="module")
def servers(model_dirs, tmp_path_factory):
    flags = ("--served-model-name", MODEL, "--dtype", "float32", "--limit-mm-per-prompt", '{"image": 2}')
    both = dict(zip(KINDS, start_servers(tmp_path_factory, *(("--model", str(model_dirs[k]), *flags) for k in KINDS))))
    yield both
    for srv in both.values():
        stop_server(srv)


@pytest.fixture(scope="module")
def server(servers):
    return servers["llava"]


@pytest.fixture(scope="module", params=KINDS)
def family(request, servers, model_dirs):
    """(the SDK on the family's server, transformers' greedy tokens over (ids, images), its image token)."""
    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    model_dir = model_dirs[request.param]
    images_of = AutoImageProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()

    def generate(ids: list[int], images) -> list[int]:
        arrays = dict(images_of(images, return_tensors="np"))
        with torch.inference_mode():
            out = model.generate(torch.tensor([ids]), **forward_kwargs(model, ids, arrays), max_new_tokens=NEW_TOKENS,
                                 min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
        return out[0, len(ids):].tolist()

    return sdk_client(servers[request.param]), generate, model.config.image_token_id


def ask(text: str, *urls: str, role_text: str | None = None) -> list[dict]:
    parts = [{"type": "text", "text": text}, *({"type": "image_url", "image_url": {"url": u}} for u in urls)]
    return ([{"role": "system", "content": role_text}] if role_text else []) + [{"role": "user", "content": parts}]


def test_answers_are_transformers_own_for_png_and_jpeg(family):
    client, generate, image_id = family
    png, jpeg = image(1), image(2, width=64, height=48)
    messages = ask("Compare these two pictures.", data_url(png), data_url(jpeg, "JPEG"))
    done = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=NEW_TOKENS, temperature=0,
                                          extra_body=IDS)
    prompt = done.prompt_token_ids
    assert prompt.count(image_id) >= 2 * 4
    from PIL import Image

    decoded_jpeg = Image.open(io.BytesIO(base64.b64decode(data_url(jpeg, "JPEG").split(",")[1]))).convert("RGB")
    assert done.choices[0].token_ids == generate(prompt, [png, decoded_jpeg])
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=NEW_TOKENS, temperature=0,
                                            stream=True, extra_body=IDS)
    streamed = [t for chunk in stream for choice in chunk.choices for t in (getattr(choice, "token_ids", None) or [])]
    assert streamed == done.choices[0].token_ids


def test_the_image_moves_the_answer(family):
    client, generate, _ = family
    answers = {}
    for seed in (3, 4):
        done = client.chat.completions.create(model=MODEL, messages=ask("What is this?", data_url(image(seed))),
                                              max_tokens=NEW_TOKENS, temperature=0, extra_body=IDS)
        assert done.choices[0].token_ids == generate(done.prompt_token_ids, [image(seed)])
        answers[seed] = done
    assert answers[3].prompt_token_ids == answers[4].prompt_token_ids  # the same ids: only the pixels differ
    assert answers[3].choices[0].token_ids != answers[4].choices[0].token_ids


def test_the_same_image_is_a_prefix_hit_and_another_is_not(family):
    client = family[0]

    def cached(seed: int) -> int:
        messages = ask("Describe the picture in a few words.", data_url(image(seed)), role_text="Be brief.")
        done = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, temperature=0)
        return done.usage.prompt_tokens_details.cached_tokens

    assert cached(5) == 0
    assert cached(5) >= TOKENS_PER_IMAGE
    assert cached(6) == 0


def _tiff() -> str:
    buffer = io.BytesIO()
    image(7).save(buffer, format="TIFF")
    return "data:image/tiff;base64," + base64.b64encode(buffer.getvalue()).decode()


def _huge_png() -> str:  # 4,097 x 4,097 of one colour: 50 KB of PNG, 50 MB of pixels
    from PIL import Image

    return data_url(Image.new("RGB", (4097, 4097), (200, 30, 30)))


@pytest.mark.parametrize("messages,param", [
    (ask("x", "https://example.com/cat.png"), "messages[0].content[1].image_url.url"),
    (ask("x", "data:image/png;base64,not base64!"), "messages[0].content[1].image_url.url"),
    (ask("x", "data:image/png;base64," + base64.b64encode(b"not an image").decode()),
     "messages[0].content[1].image_url.url"),
    (ask("x", data_url(image(1)), data_url(image(2)), data_url(image(3))), "messages[0].content[3].image_url.url"),
    (ask("an <image> typed as text", data_url(image(1))), "messages"),
    ([{"role": "user", "content": [{"type": "image_url"}]}], "messages[0].content[0].image_url"),
], ids=["http-url", "bad-base64", "not-an-image", "three-images", "placeholder-in-text", "no-image-url"])
def test_bad_images_are_400s_naming_their_part(server, messages, param):
    resp = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=60,
                      json={"model": MODEL, "messages": messages, "max_tokens": 2})
    check_error(resp, 400, param)


def test_unserved_formats_and_bombs_are_400s(server):
    """A TIFF, 4,097 x 4,097 pixels, and an image 201 times as wide as tall (a processor would scale it to
    336 x 67,536); then truncation, which would cut an image."""
    for url in (_tiff(), _huge_png(), data_url(image(8, width=402, height=2))):  # the last: 201 times as wide
        resp = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=60,
                          json={"model": MODEL, "messages": ask("x", url), "max_tokens": 2})
        check_error(resp, 400, "messages[0].content[1].image_url.url")
    resp = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=60,
                      json={"model": MODEL, "messages": ask("x", data_url(image(1))), "max_tokens": 2,
                            "truncate_prompt_tokens": 8})
    check_error(resp, 400, "truncate_prompt_tokens")
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200


def test_responses_and_anthropic_messages_take_images_as_chat_does(server):
    """OpenAI's Responses API (input_image) and Anthropic's Messages API (a base64 image block), each with the SDK:
    the same greedy text as chat's for the same text and image, and the same prompt tokens."""
    import anthropic

    url = data_url(image(9))
    chat = sdk_client(server).chat.completions.create(model=MODEL, messages=ask("What is this?", url),
                                                      max_tokens=NEW_TOKENS, temperature=0, extra_body=IDS)
    response = sdk_client(server).responses.create(
        model=MODEL, input=[{"role": "user", "content": [{"type": "input_text", "text": "What is this?"},
                                                         {"type": "input_image", "image_url": url}]}],
        max_output_tokens=NEW_TOKENS, temperature=0, extra_body={"ignore_eos": True})
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    claude = anthropic.Anthropic(base_url=server.base_url, api_key="x", _strict_response_validation=True,
                                 max_retries=0, timeout=120)
    blocks = [{"type": "text", "text": "What is this?"},
              {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": url.split(",")[1]}}]
    message = claude.messages.create(model=MODEL, max_tokens=NEW_TOKENS, messages=[{"role": "user", "content": blocks}],
                                     extra_body={"ignore_eos": True, "temperature": 0})  # the SDK dropped temperature
    assert message.content[0].text == chat.choices[0].message.content
    counted = claude.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": blocks}])
    usage = message.usage  # Anthropic's input_tokens leave out what the cache read: chat's blocks, the same image's
    assert counted.input_tokens == usage.input_tokens + usage.cache_read_input_tokens == chat.usage.prompt_tokens
    assert usage.cache_read_input_tokens >= TOKENS_PER_IMAGE
    url_block = {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}
    resp = httpx.post(f"{server.base_url}/v1/messages", timeout=60, json={
        "model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": [url_block]}]})
    assert resp.status_code == 400 and resp.json()["type"] == "error"  # Anthropic's shape, the field in its message
    assert "messages[0].content[0].source.type" in resp.json()["error"]["message"]
    resp = httpx.post(f"{server.base_url}/v1/responses", timeout=60, json={
        "model": MODEL, "input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]})
    check_error(resp, 400, "input[0].content[0].image_url")


def test_ollama_images_as_chat_takes_them(server):
    """Ollama's client: a message's `images` (base64, no media type), placed before its text, as chat's parts."""
    import ollama

    url = data_url(image(10))
    parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What is this?"}]
    chat = sdk_client(server).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": parts}],
                                                      max_tokens=NEW_TOKENS, temperature=0)
    api = ollama.Client(host=server.base_url, timeout=120)
    options = {"temperature": 0, "num_predict": NEW_TOKENS}
    answer = api.chat(model=MODEL, options=options, messages=[{"role": "user", "content": "What is this?",
                                                                 "images": [url.split(",")[1]]}])
    assert answer.message.content == chat.choices[0].message.content
    assert answer.prompt_eval_count == chat.usage.prompt_tokens
    generated = api.generate(model=MODEL, prompt="What is this?", images=[url.split(",")[1]], options=options)
    assert generated.response == chat.choices[0].message.content
    resp = httpx.post(f"{server.base_url}/api/generate", timeout=60, json={
        "model": MODEL, "prompt": "x", "raw": True, "images": [url.split(",")[1]], "stream": False})
    assert resp.status_code == 400 and "images" in resp.json()["error"]


def test_the_operators_pixel_budget_sets_a_qwen_images_tokens(servers, model_dirs, tmp_path_factory):
    """--mm-processor-kwargs: the tiny Qwen2.5-VL's own budget is 112 x 112 pixels; at 224 x 224 an image has as many
    tokens more as its image processor given that budget makes. A model without a pixel budget (LLaVA) refuses the
    flag at start, exit status 2."""
    from transformers import AutoImageProcessor

    pixels = {"min_pixels": 224 * 224, "max_pixels": 224 * 224}
    budget = ("--mm-processor-kwargs", json.dumps(pixels))
    llava = launch_server(tmp_path_factory, "--model", str(model_dirs["llava"]), *budget)
    assert llava.proc.wait(120) == 2 and "not a Qwen2-VL or Qwen2.5-VL model" in llava.log()
    llava.stop()
    qwen = start_server(tmp_path_factory, "--model", str(model_dirs["qwen2_5_vl"]), "--served-model-name", MODEL,
                        "--dtype", "float32", *budget)
    try:
        messages = ask("What is this?", data_url(image(3)))
        tokens = [sdk_client(srv).chat.completions.create(model=MODEL, messages=messages, max_tokens=1).usage.prompt_tokens
                  for srv in (servers["qwen2_5_vl"], qwen)]
        image_tokens = [AutoImageProcessor.from_pretrained(model_dirs["qwen2_5_vl"], **kwargs)(
            [image(3)], return_tensors="np")["image_grid_thw"][0].prod() // 4 for kwargs in ({}, pixels)]
        assert image_tokens[1] > 3 * image_tokens[0] and tokens[1] - tokens[0] == image_tokens[1] - image_tokens[0], (
            tokens, image_tokens)
    finally:
        stop_server(qwen)


@pytest.mark.parametrize("text", ["<start_of_image>", "two <image_soft_token><image_soft_token>"])
def test_gemma3s_image_tokens_typed_as_text_are_400s(servers, text):
    resp = httpx.post(f"{servers['gemma3'].base_url}/v1/chat/completions", timeout=60,
                      json={"model": MODEL, "messages": ask(text, data_url(image(1))), "max_tokens": 1})
    check_error(resp, 400, "messages")
    assert "only an image_url part may" in resp.json()["error"]["message"]


def test_a_step_too_small_for_a_gemma3_image_stops_the_start(model_dirs, tmp_path_factory):
    """Gemma 3's image tokens attend both ways, so a step holds an image whole: a budget below its 16 tokens is
    refused at start, exit status 2."""
    srv = launch_server(tmp_path_factory, "--model", str(model_dirs["gemma3"]), "--max-num-batched-tokens", "15")
    assert srv.proc.wait(120) == 2 and "is 16 tokens that attend both ways" in srv.log()
    srv.stop()
