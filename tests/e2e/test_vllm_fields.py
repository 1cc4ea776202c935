"""vLLM's request fields through a real `rill serve` (the shared server) with the openai SDK (strict) and the
OpenAPI spec: `return_token_ids` (the prompt's token ids and each choice's, in the body and across a stream's
chunks), `return_tokens_as_token_ids`, `allowed_token_ids` and `bad_words`."""
from __future__ import annotations

from tests.helpers.http_calls import HELLO, MODEL, check_error, post, stream_chunks
from tests.helpers.openapi import validate

PROMPT = "The lighthouse keeper looked at the sea and"
OTHER = "Bread is made of"
IDS = {"return_token_ids": True}


def test_completions_carry_the_prompts_and_the_choices_ids(client, tokenizer):
    prompt_ids, other_ids = tokenizer.encode(PROMPT).ids, tokenizer.encode(OTHER).ids
    done = client.completions.create(model=MODEL, prompt=[PROMPT, OTHER], n=2, max_tokens=6, temperature=0,
                                     extra_body={**IDS, "ignore_eos": True})
    assert [c.prompt_token_ids for c in done.choices] == [prompt_ids, prompt_ids, other_ids, other_ids]
    for choice in done.choices:
        assert len(choice.token_ids) == 6 and tokenizer.decode(choice.token_ids) == choice.text
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0)
    assert plain.choices[0].text == done.choices[0].text
    assert getattr(plain.choices[0], "token_ids", None) is None and "prompt_token_ids" not in plain.model_dump()


def test_a_completions_stream_opens_each_choice_with_the_prompt(server, tokenizer):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True, **IDS}
    whole = post(server, "/v1/completions", body).json()
    validate("CreateCompletionResponse", whole)
    chunks = stream_chunks(server, "/v1/completions", {**body, "stream": True})
    with_choices = [c for c in chunks if c["choices"]]
    assert with_choices[0]["choices"][0]["prompt_token_ids"] == tokenizer.encode(PROMPT).ids
    assert not any("prompt_token_ids" in c["choices"][0] for c in with_choices[1:])
    streamed = [t for c in with_choices for t in c["choices"][0]["token_ids"]]
    assert streamed == whole["choices"][0]["token_ids"] and len(streamed) == 8


def test_chat_ids_hold_the_template_and_the_stop_token(server, client, tokenizer):
    rendered = post(server, "/tokenize", {"model": MODEL, "messages": HELLO}).json()["tokens"]
    done = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=300, temperature=0, extra_body=IDS)
    assert done.choices[0].finish_reason == "stop", "the greedy answer did not end in 300 tokens"
    assert done.prompt_token_ids == rendered
    ids = done.choices[0].token_ids
    assert len(ids) == done.usage.completion_tokens
    # As vLLM's: the stop token (the model's end of turn) is in the ids and not in the text.
    assert tokenizer.decode(ids[:-1]) == done.choices[0].message.content
    assert tokenizer.id_to_token(ids[-1]) == "<|im_end|>"


def test_a_chat_stream_sends_the_prompt_once_and_every_id(server, tokenizer):
    body = {"model": MODEL, "messages": HELLO, "max_tokens": 12, "temperature": 0, "stream": True, **IDS,
            "stream_options": {"include_usage": True}}
    chunks = stream_chunks(server, "/v1/chat/completions", body)
    assert "prompt_token_ids" in chunks[0] and not any("prompt_token_ids" in c for c in chunks[1:])
    streamed = [t for c in chunks for choice in c["choices"] for t in choice.get("token_ids", [])]
    assert len(streamed) == chunks[-1]["usage"]["completion_tokens"] == 12
    text = "".join(choice["delta"].get("content") or "" for c in chunks for choice in c["choices"])
    assert tokenizer.decode(streamed) == text
    whole = post(server, "/v1/chat/completions", {**body, "stream": False, "stream_options": None}).json()
    validate("CreateChatCompletionResponse", whole)
    assert whole["choices"][0]["token_ids"] == streamed and whole["prompt_token_ids"] == chunks[0]["prompt_token_ids"]


def test_logprobs_can_name_tokens_by_their_ids(client):
    """vLLM's return_tokens_as_token_ids: "token_id:N" for each token and its alternatives, the same N as
    return_token_ids gives."""
    done = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2,
                                     extra_body={**IDS, "ignore_eos": True, "return_tokens_as_token_ids": True})
    choice = done.choices[0]
    assert choice.logprobs.tokens == [f"token_id:{t}" for t in choice.token_ids]
    assert all(k.startswith("token_id:") for top in choice.logprobs.top_logprobs for k in top)
    chat = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=5, temperature=0, logprobs=True,
                                          top_logprobs=2, extra_body={**IDS, "ignore_eos": True,
                                                                      "return_tokens_as_token_ids": True})
    content = chat.choices[0].logprobs.content
    assert [c.token for c in content] == [f"token_id:{t}" for t in chat.choices[0].token_ids]
    assert all(bytes(c.bytes).decode() == c.token for c in content)
    assert all(t.token.startswith("token_id:") for c in content for t in c.top_logprobs)


def test_allowed_token_ids_are_all_a_choice_samples(server, client, tokenizer):
    """vLLM's allowed_token_ids, sampled and greedy, with logit_bias among them; bad lists a 400 naming it."""
    allowed = [tokenizer.token_to_id(w) for w in ("Ġyes", "Ġno", "Ġmaybe")]
    sampled = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=1.0, seed=3,
                                        extra_body={**IDS, "ignore_eos": True, "allowed_token_ids": allowed})
    assert set(sampled.choices[0].token_ids) <= set(allowed) and len(sampled.choices[0].token_ids) == 16
    greedy = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0,
                                       logit_bias={str(allowed[2]): 100},
                                       extra_body={**IDS, "ignore_eos": True, "allowed_token_ids": allowed})
    assert greedy.choices[0].token_ids == [allowed[2]] * 4
    for bad in ([], [tokenizer.get_vocab_size() + 10], [1] * 16_385, [-1], ["x"]):  # the last two name the entry
        error = check_error(post(server, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 2,
                                                             "allowed_token_ids": bad}), 400)
        assert error["param"] in ("allowed_token_ids", "allowed_token_ids[0]"), error


def test_bad_words_are_never_written(server, client, tokenizer):
    """vLLM's bad_words: the greedy answer's first word banned, bare and after a space (" sea" is a token of its
    own here), and a two-token phrase of it banned as a pair."""
    from rill.asgi.requests.bad_words import bad_words_ids

    bare, spaced = bad_words_ids(tokenizer, ["  sea"])
    assert bare == tokenizer.encode("sea", add_special_tokens=False).ids and spaced == [tokenizer.token_to_id("Ġsea")]
    args = dict(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0)
    plain = client.completions.create(**args, extra_body={**IDS, "ignore_eos": True}).choices[0].token_ids
    first_word = tokenizer.decode(plain[:1])
    banned = client.completions.create(**args, extra_body={**IDS, "ignore_eos": True, "bad_words": [first_word]})
    ids = banned.choices[0].token_ids
    assert ids[0] != plain[0] and plain[0] not in ids
    pair = tokenizer.decode(plain[:2])
    assert len(bad_words_ids(tokenizer, [pair])[0]) == 2, pair
    no_pair = client.completions.create(**args, extra_body={**IDS, "ignore_eos": True, "bad_words": [pair]})
    ids = no_pair.choices[0].token_ids
    assert ids[0] == plain[0] and ids[1] != plain[1]
    too_long = post(server, "/v1/completions", {**args, "bad_words": ["x" * 257]})
    assert check_error(too_long, 400)["param"] == "bad_words[0]"


def test_constraints_that_leave_no_token_end_the_choice_as_a_stop(server, client, tokenizer):
    """allowed_token_ids that a grammar or bad_words rule out entirely: the choice stops there (finish_reason stop,
    only the allowed tokens written before), never a failed request nor a token outside the lists."""
    yes, no = tokenizer.token_to_id("Ġyes"), tokenizer.token_to_id("Ġno")
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "temperature": 0, **IDS}
    with_grammar = post(server, "/v1/completions", {**body, "allowed_token_ids": [yes, no],
                                                    "structured_outputs": {"choice": ["maybe", "perhaps"]}})
    assert with_grammar.status_code == 200, with_grammar.text
    choice = with_grammar.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["text"] == ""
    banned = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=1.0, seed=1,
                                       extra_body={**IDS, "ignore_eos": True, "allowed_token_ids": [yes, no],
                                                   "bad_words": ["yes", "no"]})
    assert banned.choices[0].finish_reason == "stop" and banned.choices[0].text == ""
    # Two steps in: every allowed token may open the output, none may follow it.
    pairs = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0,
                                      extra_body={**IDS, "ignore_eos": True, "allowed_token_ids": [yes, no],
                                                  "bad_words": [" yes yes", " yes no", " no yes", " no no"]})
    choice = pairs.choices[0]
    assert choice.finish_reason == "stop" and choice.text in (" yes", " no"), choice


def test_chat_echo_opens_the_answer_with_the_last_assistant_message(server, client):
    """vLLM's chat `echo`: with the assistant's own last message continued, the answer opens with that text, in the
    body and in the stream's first chunk; the rest is what the same request without echo writes. After a user's
    message nothing is echoed."""
    start = "Once upon a time, in a small village,"
    messages = [{"role": "user", "content": "Tell me a story."}, {"role": "assistant", "content": start}]
    flags = {"continue_final_message": True, "add_generation_prompt": False, "ignore_eos": True}
    ask = lambda **extra: client.chat.completions.create(  # noqa: E731
        model=MODEL, messages=messages, max_tokens=8, temperature=0, extra_body={**flags, **extra})
    plain, echoed = ask().choices[0].message.content, ask(echo=True).choices[0].message.content
    assert echoed == start + plain and plain
    body = {"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0, "stream": True, "echo": True,
            **flags}
    chunks = [c for c in stream_chunks(server, "/v1/chat/completions", body) if c["choices"]]
    assert chunks[0]["choices"][0]["delta"]["content"] == start
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == echoed
    after_user = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4, temperature=0,
                                                extra_body={"echo": True})
    assert after_user.choices[0].message.content == client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=4, temperature=0).choices[0].message.content
