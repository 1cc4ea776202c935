"""Structured outputs end to end: the bundled model, sampled at temperature 1, still follows every constraint."""
from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import openai
import pytest

from tests.helpers.http_calls import check_error, sse_events
from tests.helpers.openapi import validate

MODEL = "smollm2-135m-instruct"
ASK = [{"role": "user", "content": "Describe a person as JSON: a name, an age, and whether they are a member."}]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "member": {"type": "boolean"},
        "tier": {"enum": ["gold", "silver"]},
    },
    "required": ["name", "age", "member", "tier"],
    "additionalProperties": False,
}
PERSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
SEEDS = range(4)
REGEX = r"[A-Z][a-z]{2,8} (19|20)[0-9]{2}"
COLOURS = ["red", "green", "light blue"]
GRAMMAR = 'root ::= "1" ("," digit)*\ndigit ::= [0-9]'


def chat_body(**fields) -> dict:
    return {"model": MODEL, "messages": ASK, "max_tokens": 80, **fields}


@pytest.fixture(scope="module")
def results(server, client):
    """Every generation of this file, sent at once (they share the engine's batches): name -> result."""
    def raw(path, body):
        return httpx.post(f"{server.base_url}{path}", json=body, timeout=120).json()

    def raw_stream(body):
        with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=body, timeout=120) as r:
            return [json.loads(e) for e in sse_events(r) if not e.startswith(":") and e != "[DONE]"]

    create = client.chat.completions.create
    jobs = {
        **{f"schema{seed}": lambda seed=seed: create(**chat_body(temperature=1.0, seed=seed),
                                                    response_format=PERSON_FORMAT) for seed in SEEDS},
        "schema_raw": lambda: raw("/v1/chat/completions", chat_body(temperature=0, response_format=PERSON_FORMAT)),
        "schema_completions": lambda: raw("/v1/completions", {
            "model": MODEL, "prompt": "A person as JSON:", "max_tokens": 80, "temperature": 1.0, "seed": 3,
            "structured_outputs": {"json": PERSON}}),
        "schema_stream": lambda: list(create(**chat_body(temperature=1.0, seed=11), response_format=PERSON_FORMAT,
                                             stream=True)),
        "schema_stream_raw": lambda: raw_stream(chat_body(temperature=1.0, seed=12, stream=True, guided_json=PERSON)),
        "object": lambda: create(**chat_body(temperature=0), response_format={"type": "json_object"}),
        **{f"regex{seed}": lambda seed=seed: create(**chat_body(max_tokens=30, temperature=1.0, seed=seed),
                                                   extra_body={"guided_regex": REGEX}) for seed in SEEDS},
        # seeds 0 and 1 also ask for min_tokens and ignore_eos: a complete grammar ends the request all the same
        **{f"choice{seed}": lambda seed=seed: create(
            model=MODEL, messages=[{"role": "user", "content": "A colour?"}], max_tokens=20, temperature=1.0, seed=seed,
            extra_body=({"structured_outputs": {"choice": COLOURS}} if seed % 2 else {"guided_choice": COLOURS})
            | ({"min_tokens": 20, "ignore_eos": True} if seed < 2 else {})) for seed in SEEDS},
        "grammar": lambda: client.completions.create(model=MODEL, prompt="Count:", max_tokens=20, temperature=1.0,
                                                     seed=5, extra_body={"guided_grammar": GRAMMAR}),
    }
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
        return {name: future.result() for name, future in futures.items()}


def test_json_schema_holds_over_sampled_outputs(results):
    outputs = [results[f"schema{seed}"].choices[0] for seed in SEEDS]
    for choice in outputs:
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), PERSON)
    assert len({c.message.content for c in outputs}) > 1  # sampled, not one canned answer


def test_json_schema_raw_body_and_completions_route(results):
    raw = results["schema_raw"]
    validate("CreateChatCompletionResponse", raw)
    jsonschema.validate(json.loads(raw["choices"][0]["message"]["content"]), PERSON)
    raw = results["schema_completions"]
    validate("CreateCompletionResponse", raw)
    assert raw["choices"][0]["finish_reason"] == "stop"
    jsonschema.validate(json.loads(raw["choices"][0]["text"]), PERSON)


def test_json_schema_streamed(results):
    chunks = [c for c in results["schema_stream"] if c.choices]
    jsonschema.validate(json.loads("".join(c.choices[0].delta.content or "" for c in chunks)), PERSON)
    assert chunks[-1].choices[0].finish_reason == "stop"
    events = results["schema_stream_raw"]
    for event in events:
        validate("CreateChatCompletionStreamResponse", event)
    jsonschema.validate(json.loads("".join(e["choices"][0]["delta"].get("content") or "" for e in events)), PERSON)


def test_the_keys_a_schema_forces_were_drafted_and_accepted(server, results):
    """Jump-forward (--jump-forward-tokens, on by default): the schemas' keys were drafted from the grammar and the
    model kept some (every output above still meets its schema); /metrics counts them as /stats does."""
    stats = httpx.get(f"{server.base_url}/stats", timeout=30).json()
    assert 0 < stats["num_jump_forward_accepted"] <= stats["num_jump_forward_tokens"], stats
    metrics = httpx.get(f"{server.base_url}/metrics", timeout=30).text
    assert re.search(r":jump_forward_accepted_tokens_total\{[^}]*\} [1-9]", metrics), metrics[-2000:]


def test_json_object_is_an_object(results):
    resp = results["object"]
    assert resp.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(resp.choices[0].message.content), dict)


def test_regex_matches(results):
    for seed in SEEDS:
        choice = results[f"regex{seed}"].choices[0]
        assert choice.finish_reason == "stop" and re.fullmatch(REGEX, choice.message.content), choice.message.content


def test_choice_is_one_of_the_choices_even_with_min_tokens_and_ignore_eos(results):
    for seed in SEEDS:
        resp = results[f"choice{seed}"]
        assert resp.choices[0].finish_reason == "stop" and resp.choices[0].message.content in COLOURS
        assert resp.usage.completion_tokens <= len("light blue") + 1  # not min_tokens' 20


def test_grammar_on_completions(results):
    choice = results["grammar"].choices[0]
    if choice.finish_reason == "stop":
        assert re.fullmatch(r"1(,[0-9])*", choice.text), choice.text
    else:  # cut by max_tokens: a prefix of a sentence
        assert choice.finish_reason == "length" and re.fullmatch(r"1(,[0-9])*,?", choice.text), choice.text


@pytest.mark.parametrize("extra,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"guided_regex": "(unclosed"}, "guided_regex"),
    ({"guided_grammar": 'root ::= root "a"'}, "guided_grammar"),  # admits no output: nothing to sample
    ({"guided_choice": []}, "guided_choice"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a+"}, "guided_regex"),
])
def test_bad_constraints_are_400(server, client, extra, param):
    body = {"model": MODEL, "messages": ASK, "max_tokens": 5, **extra}
    check_error(httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=60), 400, param)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=5, extra_body=extra)
    assert info.value.body["param"] == param
