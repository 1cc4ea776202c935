"""vLLM's `truncate_prompt_tokens` through a real `rill serve` (the shared server, --max-model-len 2048), with the
openai SDK (strict): a prompt's last k tokens only, in completions and chat; bad values a 400 naming the field."""
from __future__ import annotations

import openai
import pytest

from tests.helpers.http_calls import HELLO, MODEL, check_error, post

STORY = "Once upon a time a small boat left the harbour at dawn, and the sea was calm and grey. "
GREEDY = dict(max_tokens=8, temperature=0, extra_body={"ignore_eos": True})


def test_completions_read_the_last_k_tokens(client, tokenizer):
    ids = tokenizer.encode(STORY * 3).ids
    k = 12
    cut = client.completions.create(model=MODEL, prompt=STORY * 3, **{**GREEDY, "extra_body": {
        "ignore_eos": True, "truncate_prompt_tokens": k}})
    tail = client.completions.create(model=MODEL, prompt=ids[-k:], **GREEDY)
    whole = client.completions.create(model=MODEL, prompt=STORY * 3, **GREEDY)
    assert cut.usage.prompt_tokens == k and whole.usage.prompt_tokens == len(ids) > k
    assert cut.choices[0].text == tail.choices[0].text
    # -1 is the context length: a shorter prompt is whole.
    at_most = client.completions.create(model=MODEL, prompt=STORY * 3, **{**GREEDY, "extra_body": {
        "ignore_eos": True, "truncate_prompt_tokens": -1}})
    assert at_most.usage.prompt_tokens == len(ids) and at_most.choices[0].text == whole.choices[0].text


def test_echo_gives_back_what_the_model_read(client, tokenizer):
    ids = tokenizer.encode(STORY).ids
    echoed = client.completions.create(model=MODEL, prompt=STORY, echo=True, max_tokens=1, temperature=0,
                                       extra_body={"truncate_prompt_tokens": 5})
    assert echoed.choices[0].text.startswith(tokenizer.decode(ids[-5:]))
    assert not echoed.choices[0].text.startswith(STORY[:10])


def test_a_prompt_longer_than_the_context_is_served_from_its_end(server, client, tokenizer):
    long_prompt = STORY * 150  # about 3,000 tokens, the context 2,048
    assert len(tokenizer.encode(long_prompt).ids) > 2048
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt=long_prompt, max_tokens=4)
    served = client.completions.create(model=MODEL, prompt=long_prompt, max_tokens=4,
                                       extra_body={"truncate_prompt_tokens": 100})
    assert served.usage.prompt_tokens == 100 and served.usage.completion_tokens == 4
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": long_prompt}],
                                          max_tokens=4, extra_body={"truncate_prompt_tokens": 2000})
    assert chat.usage.prompt_tokens == 2000


def test_chat_reads_the_templates_last_k_tokens(server, client):
    rendered = post(server, "/tokenize", {"model": MODEL, "messages": HELLO}).json()["tokens"]
    k = 9
    cut = client.chat.completions.create(model=MODEL, messages=HELLO, **{**GREEDY, "extra_body": {
        "ignore_eos": True, "truncate_prompt_tokens": k}})
    tail = client.completions.create(model=MODEL, prompt=rendered[-k:], **GREEDY)
    assert cut.usage.prompt_tokens == k < len(rendered)
    assert cut.choices[0].message.content == tail.choices[0].text


@pytest.mark.parametrize(("path", "value", "param"), [
    ("/v1/completions", 0, "truncate_prompt_tokens"),
    ("/v1/completions", 2049, "truncate_prompt_tokens"),  # more than the context length
    ("/v1/completions", -2, "truncate_prompt_tokens"),
    ("/v1/completions", "12", "truncate_prompt_tokens"),
    ("/v1/chat/completions", 2049, "truncate_prompt_tokens"),
    ("/v1/chat/completions", 2**70, "truncate_prompt_tokens"),
])
def test_bad_values_are_a_400_naming_the_field(server, path, value, param):
    body = {"model": MODEL, "max_tokens": 2, "truncate_prompt_tokens": value}
    body.update({"messages": HELLO} if "chat" in path else {"prompt": STORY})
    check_error(post(server, path, body), 400, param=param)


def test_not_with_a_suffix(server):
    resp = post(server, "/v1/completions", {"model": MODEL, "prompt": "def f(", "suffix": "\n", "max_tokens": 2,
                                           "truncate_prompt_tokens": 4})
    check_error(resp, 400, param="suffix")
