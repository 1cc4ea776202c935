"""vLLM's utility routes: POST /tokenize and /detokenize (a prompt or chat messages), GET /version. They take
llama.cpp's spellings too (`content`, `add_special`, `with_pieces`) and answer in both servers' keys, so a
llama.cpp client counts tokens here as it does there."""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Annotated

import msgspec
from msgspec import Meta

from rill.asgi.errors import APIError
from rill.asgi.http.primitives import send_response
from rill.asgi.http.router import HTTPRequest
from rill.asgi.prompt.chat_messages import render_messages
from rill.asgi.prompt.encoding import encode_texts
from rill.asgi.requests.body import decode_json, has_messages
from rill.asgi.requests.model_choice import resolve_model
from rill.asgi.requests.schemas import INT64_MAX, ChatCompletionRequest
from rill.asgi.state import WorkerState, dumps


class TokenizePrompt(msgspec.Struct, kw_only=True):
    prompt: str | None = None
    content: str | None = None  # llama.cpp's name for the prompt
    model: str | None = None  # no bound: a name longer than the served one is a 404
    add_special_tokens: bool | None = None
    add_special: bool | None = None  # llama.cpp's name (its default: false)
    return_token_strs: bool = False
    with_pieces: bool = False  # llama.cpp's: tokens as {"id", "piece"} (the piece a string, else its bytes)


class TokenizeChat(ChatCompletionRequest, kw_only=True):
    """The chat fields that shape a prompt, so /tokenize renders exactly what chat would send."""

    model: str | None = None
    add_special_tokens: bool = False
    return_token_strs: bool = False


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    tokens: list[Annotated[int, Meta(ge=0, le=INT64_MAX)]]
    model: str | None = None


_prompt_decoder = msgspec.json.Decoder(TokenizePrompt)
chat_form_decoder = msgspec.json.Decoder(TokenizeChat)
_detokenize_decoder = msgspec.json.Decoder(DetokenizeRequest)


async def _decode(decoder: msgspec.json.Decoder, body: bytes, state: WorkerState):
    req = decode_json(decoder, body)
    await resolve_model(state, req.model)  # an adapter shares the served model's tokenizer
    return req


async def tokenize(http: HTTPRequest) -> None:
    state, body = http.state, http.body
    if has_messages(body):
        req = await _decode(chat_form_decoder, body, state)
        ids = await render_messages(state, req)  # as chat completions would, add_special_tokens as it takes it
    else:
        req = await _decode(_prompt_decoder, body, state)
        if (req.prompt is None) == (req.content is None):
            raise APIError(400, "Give the text as `prompt` (or llama.cpp's `content`), once.", param="prompt")
        specials = req.add_special_tokens if req.add_special_tokens is not None else \
            req.add_special if req.add_special is not None else req.prompt is not None
        (ids,) = await encode_texts(state.tokenizer, [req.prompt if req.prompt is not None else req.content],
                                    add_special_tokens=specials)
    tokens = [{"id": i, "piece": _piece(state, i)} for i in ids] if getattr(req, "with_pieces", False) else ids
    answer = {"count": len(ids), "max_model_len": state.settings.limits.max_model_len, "tokens": tokens,
              "token_strs": [state.tokenizer.id_to_token(i) for i in ids] if req.return_token_strs else None}
    await send_json(http.send, answer)


def _piece(state: WorkerState, token_id: int) -> str | list[int]:
    """llama.cpp's piece: the token's text, or its bytes where they are not UTF-8 on their own."""
    raw = state.token_texts.bytes(token_id)
    try:
        return bytes(raw).decode()
    except UnicodeDecodeError:
        return raw


async def detokenize(http: HTTPRequest) -> None:
    state: WorkerState = http.state
    req = await _decode(_detokenize_decoder, http.body, state)
    vocab_size = state.settings.limits.vocab_size
    if len(req.tokens) > state.settings.limits.max_model_len:  # decoded on the loop: bound the work
        raise APIError(400, f"`tokens` holds {len(req.tokens)} ids; at most {state.settings.limits.max_model_len}, "
                            "this model's context length.", param="tokens")
    for i, token_id in enumerate(req.tokens):
        if token_id >= vocab_size:
            raise APIError(400, f"Token ids must be between 0 and {vocab_size - 1}.", param=f"tokens[{i}]")
    # Ids past the tokenizer's own vocabulary (the model's embedding may be padded) decode to "".
    text = state.tokenizer.decode(req.tokens, skip_special_tokens=False)
    await send_json(http.send, {"prompt": text, "content": text})  # vLLM's key, and llama.cpp's


async def get_version(http: HTTPRequest) -> None:
    await send_json(http.send, {"version": VERSION})


async def send_json(send, obj) -> None:
    await send_response(send, 200, dumps(obj))


def _package_version() -> str:
    try:
        return version("rill")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "0+unknown"


VERSION = _package_version()
