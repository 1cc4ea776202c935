"""A seeded generator of bad request bodies for the chat and completions routes, llama.cpp's /completion and
Ollama's /api/chat and /api/generate (whose errors take Ollama's shape, `{"error": "..."}`).

Each body is a valid one with one thing broken: a field given a value of a type or range it
refuses (huge and non-finite numbers as raw JSON, deep nesting, bad UTF-8), the JSON cut short,
bad bytes dropped in, a 10 MB string, a non-JSON Content-Type. Every one must get a 4xx with an
OpenAI error body; `expected` is the exact status where one is known.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass

import httpx
import jsonschema

from tests.helpers.openapi import validate

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
LLAMA = "/completion"  # llama.cpp's native route (asgi/routes/llama_cpp.py)
OLLAMA_CHAT, OLLAMA_GENERATE = "/api/chat", "/api/generate"  # Ollama's (asgi/routes/ollama.py)
SGLANG = "/generate"  # SGLang's native route (asgi/routes/sglang.py)
TGI = "/"  # Text Generation Inference's (asgi/routes/tgi.py)
DEEP = 10_000  # levels of nesting, past msgspec's recursion limit
BIG_STRING_LEN = 10_000_000

# Raw JSON values by kind. A field is given every kind it does not accept.
CANDIDATES: dict[str, bytes] = {
    "str": b'"x"',
    "float": b"3.5",  # past every float field's upper bound, and not an int
    "neg": b"-7",
    "bool": b"true",
    "obj": b"{}",
    "list": b"[]",
    "mixed_list": b'[1, "a", null]',
    "big_int": b"1" + b"0" * 400,
    "neg_big_int": b"-1" + b"0" * 400,
    "int64_plus_1": b"9223372036854775808",
    "inf": b"1e309",
    "neg_inf": b"-1e309",
    "nan": b"NaN",
    "deep_obj": b'{"a": ' * DEEP + b"1" + b"}" * DEEP,
    "deep_list": b"[" * DEEP + b"]" * DEEP,
    "bad_utf8": b'"\xff\xfe"',
    "cut_utf8": b'"\xc3"',
    "overlong_utf8": b'"\xc0\xaf"',
    "lone_surrogate": b'"\\ud800"',
}

# What each field accepts (left out for it: a 200 would be right). Everything else is refused.
BOOL_FIELDS = ["stream", "ignore_eos", "include_stop_str_in_output", "skip_special_tokens"]
SHARED_FIELDS: dict[str, set[str]] = {
    "model": set(), "max_tokens": set(), "temperature": set(), "top_p": set(), "top_k": set(),
    "min_p": set(), "presence_penalty": set(), "frequency_penalty": set(), "repetition_penalty": set(),
    "seed": {"neg"}, "stop": {"str", "list"}, "stop_token_ids": {"list"}, "stream_options": set(),
    "min_tokens": set(), "user": {"str"}, "n": set(), "logit_bias": {"obj"}, "response_format": set(),
    **{name: {"bool"} for name in BOOL_FIELDS},
}
CHAT_FIELDS = {**SHARED_FIELDS, "messages": set(), "max_completion_tokens": set(), "add_generation_prompt": {"bool"},
               "tools": {"obj", "list"}, "chat_template_kwargs": {"obj"}, "logprobs": {"bool"}}
COMPLETION_FIELDS = {**SHARED_FIELDS, "prompt": {"str"}, "echo": {"bool"}, "logprobs": set(), "best_of": set()}
LLAMA_FIELDS = {"model": set(), "prompt": {"str"}, "n_predict": set(), "temperature": set(), "top_k": set(),
                "top_p": set(), "min_p": set(), "repeat_penalty": set(), "presence_penalty": set(),
                "frequency_penalty": set(), "seed": {"neg"}, "stop": {"list"}, "n_probs": set(), "grammar": {"str"},
                "return_tokens": {"bool"}, "ignore_eos": {"bool"}, "stream": {"bool"}}
# Ollama's: `format` takes any object as a JSON schema ({} is any JSON), `think` a bool or a level's name; a body
# without `messages` or `prompt` is Ollama's "load the model", a 200.
OLLAMA_SHARED = {"model": set(), "stream": {"bool"}, "options": {"obj"}, "format": {"obj"}, "think": {"bool", "str"}}
OLLAMA_CHAT_FIELDS = {**OLLAMA_SHARED, "messages": {"list"}, "tools": {"list"}}
OLLAMA_GENERATE_FIELDS = {**OLLAMA_SHARED, "prompt": {"str"}, "system": {"str"}, "raw": {"bool"}, "suffix": set()}
SGLANG_FIELDS = {"model": set(), "text": {"str"}, "input_ids": set(), "sampling_params": {"obj"}, "stream": {"bool"},
                 "return_logprob": set()}
TGI_FIELDS = {"inputs": {"str"}, "parameters": {"obj"}, "stream": {"bool"}}
# Inside the first chat message: (key, accepted kinds).
MESSAGE_FIELDS = {"role": {"str"}, "content": {"str", "list"}, "name": {"str"}}
OLLAMA_MESSAGE_FIELDS = {"role": {"str"}, "content": {"str"}, "thinking": {"str"}, "tool_name": {"str"}}


@dataclass
class BadRequest:
    label: str
    path: str
    body: bytes
    content_type: str | None = "application/json"
    expected: int | None = None  # None: any 4xx

    def headers(self) -> dict[str, str]:
        return {} if self.content_type is None else {"content-type": self.content_type}


def valid_bodies(model: str) -> dict[str, dict]:
    return {
        CHAT: {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
        COMPLETIONS: {"model": model, "prompt": "Once upon a time", "max_tokens": 4},
        LLAMA: {"model": model, "prompt": "Once upon a time", "n_predict": 4},
        OLLAMA_CHAT: {"model": model, "messages": [{"role": "user", "content": "Hi"}], "stream": False,
                      "options": {"num_predict": 4}},
        OLLAMA_GENERATE: {"model": model, "prompt": "Once upon a time", "stream": False, "options": {"num_predict": 4}},
        SGLANG: {"model": model, "text": "Once upon a time", "sampling_params": {"max_new_tokens": 4}},
        TGI: {"inputs": "Once upon a time", "parameters": {"max_new_tokens": 4}},
    }


def fields_of(path: str) -> dict[str, set[str]]:
    return {CHAT: CHAT_FIELDS, COMPLETIONS: COMPLETION_FIELDS, LLAMA: LLAMA_FIELDS, OLLAMA_CHAT: OLLAMA_CHAT_FIELDS,
            OLLAMA_GENERATE: OLLAMA_GENERATE_FIELDS, SGLANG: SGLANG_FIELDS, TGI: TGI_FIELDS}[path]


def with_field(body: dict, key: str, raw: bytes) -> bytes:
    """`body` as JSON with `key` set to the raw JSON `raw` (which json.dumps cannot write)."""
    rest = {k: v for k, v in body.items() if k != key}
    return json.dumps(rest)[:-1].encode() + b', "' + key.encode() + b'": ' + raw + b"}"


def with_message_field(body: dict, key: str, raw: bytes) -> bytes:
    message = {k: v for k, v in body["messages"][0].items() if k != key}
    raw_message = json.dumps(message)[:-1].encode() + b', "' + key.encode() + b'": ' + raw + b"}"
    return with_field(body, "messages", b"[" + raw_message + b"]")


def wrong_values(path: str, body: dict) -> list[BadRequest]:
    fields = fields_of(path)
    out = [BadRequest(f"{key}={kind}", path, with_field(body, key, raw))
           for key, accepted in fields.items() for kind, raw in CANDIDATES.items() if kind not in accepted]
    if path in (CHAT, OLLAMA_CHAT):
        out += [BadRequest(f"messages[0].{key}={kind}", path, with_message_field(body, key, raw))
                for key, accepted in (MESSAGE_FIELDS if path == CHAT else OLLAMA_MESSAGE_FIELDS).items()
                for kind, raw in CANDIDATES.items()
                if kind not in accepted]
    return out


def missing_fields(path: str, body: dict) -> list[BadRequest]:
    required = ["model", "messages"] if path == CHAT else ["prompt"] if path == LLAMA else ["model", "prompt"]
    return [BadRequest(f"no {key}", path, json.dumps({k: v for k, v in body.items() if k != key}).encode())
            for key in required]


def not_objects(path: str) -> list[BadRequest]:
    raws = [b"", b"null", b"1", b'"x"', b"[]", b"true", b"{", b"}", b"NaN", CANDIDATES["deep_obj"],
            CANDIDATES["deep_list"], b'{"a": 1} trailing', b"\xef\xbb\xbf{}", b"\x00" * 64]
    return [BadRequest(f"body={raw[:12]!r}", path, raw) for raw in raws]


def truncated(rng: random.Random, path: str, body: dict) -> list[BadRequest]:
    """Every proper prefix of a JSON object is invalid: cut it every few bytes."""
    raw = json.dumps(body).encode()
    cuts, at = [], 0
    while at < len(raw):
        cuts.append(at)
        at += rng.randint(1, 6)
    return [BadRequest(f"cut at {n}/{len(raw)}", path, raw[:n]) for n in cuts]


def bad_bytes(rng: random.Random, path: str, body: dict, num: int = 24) -> list[BadRequest]:
    """Invalid UTF-8 dropped in at random places: inside strings, between tokens, in keys."""
    raw = json.dumps(body).encode()
    seqs = [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf8\x88\x80\x80\x80", b"\x80"]
    out = []
    for _ in range(num):
        at = rng.randrange(1, len(raw) - 1)
        seq = rng.choice(seqs)
        out.append(BadRequest(f"{seq!r} at {at}", path, raw[:at] + seq + raw[at:]))
    return out


def mixed(rng: random.Random, path: str, body: dict, num: int = 24) -> list[BadRequest]:
    """Two to four wrong fields at once, drawn at random."""
    fields = fields_of(path)
    out = []
    for _ in range(num):
        picks = rng.sample(sorted(fields), rng.randint(2, min(4, len(fields))))
        raw_body = dict(body)
        parts = []
        for key in picks:
            kind = rng.choice([k for k in CANDIDATES if k not in fields[key] and not k.startswith("deep")])
            raw_body.pop(key, None)
            parts.append((key, kind))
        raw = json.dumps(raw_body)[:-1].encode()
        for key, kind in parts:
            raw += b', "' + key.encode() + b'": ' + CANDIDATES[kind]
        out.append(BadRequest("+".join(f"{k}={v}" for k, v in parts), path, raw + b"}"))
    return out


def big_strings(path: str, body: dict) -> list[BadRequest]:
    """10 MB strings within the 12 MiB limit (refused for another reason), and 13 MB past it."""
    big = b'"' + b"a" * BIG_STRING_LEN + b'"'
    return [
        BadRequest("10 MB model", path, with_field(body, "model", big), expected=404),
        BadRequest("10 MB user, max_tokens 0", path, with_field({**body, "max_tokens": 0, "n_predict": -2}, "user", big)),
        BadRequest("10 MB stop, bad temperature", path, with_field({**body, "temperature": -1}, "stop", big)),
        BadRequest("13 MB body", path, with_field(body, "user", b'"' + b"a" * 13_000_000 + b'"'), expected=413),
    ]


def content_types(path: str, body: dict) -> list[BadRequest]:
    raw = json.dumps(body).encode()
    out = [BadRequest(f"content-type {ct}", path, raw, content_type=ct, expected=415)
           for ct in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=b",
                      "application/xml", "text/json", "")]
    broken = json.dumps({**body, "max_tokens": -1, "n_predict": -2}).encode()  # no Content-Type: a 415, never decoded
    return out + [BadRequest("no content-type, bad max_tokens", path, broken, content_type=None, expected=415)]


def generate(model: str, seed: int = 5) -> list[BadRequest]:
    """Every bad request, in a fixed order for a given seed."""
    rng = random.Random(seed)
    out: list[BadRequest] = []
    for path, body in valid_bodies(model).items():
        out += wrong_values(path, body)
        out += not_objects(path)
        out += truncated(rng, path, body)
        out += bad_bytes(rng, path, body)
        out += mixed(rng, path, body)
        out += content_types(path, body)
        if not path.startswith("/api/") and path not in (SGLANG, TGI):  # their bodies take none of these fields
            out += missing_fields(path, body)
            out += big_strings(path, body)
    return out


def problem(resp: httpx.Response, expected: int | None, path: str = CHAT) -> str | None:
    """Why this answer to a bad request is wrong, or None."""
    status_ok = resp.status_code == expected if expected is not None else 400 <= resp.status_code < 500
    if not status_ok:
        return f"status {resp.status_code} (wanted {expected or '4xx'}): {resp.text[:200]}"
    if not resp.headers.get("content-type", "").startswith("application/json"):
        return f"content-type {resp.headers.get('content-type')!r}"
    if path.startswith("/api/"):  # Ollama's shape
        body = resp.json()
        return None if set(body) == {"error"} and isinstance(body["error"], str) and body["error"] else \
            f"not an Ollama error body: {resp.text[:200]}"
    try:
        body = resp.json()
        validate("ErrorResponse", body)
    except (ValueError, jsonschema.ValidationError) as exc:
        return f"not an OpenAI error body ({exc}): {resp.text[:200]}"
    if set(body["error"]) != {"message", "type", "param", "code"} or not body["error"]["message"]:
        return f"error object {body['error']}"
    return None
