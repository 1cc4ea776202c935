"""Ollama's API (docs/ollama-api.md), for the clients and apps written for it: POST /api/chat and /api/generate
(over chat's machinery: the template, tools, reasoning and structured outputs), /api/embed and /api/embeddings,
POST /api/show, GET /api/tags, /api/ps and /api/version. Errors on /api/ take Ollama's shape, `{"error": ...}`."""
from __future__ import annotations

import functools
import hashlib
import json
import time
from pathlib import Path
from types import SimpleNamespace

import msgspec
import numpy as np

from rill.asgi.engine_link.generate import Generation, GenerationFailed, new_request_id
from rill.asgi.errors import APIError, renamed
from rill.asgi.http.access_log import log_request_content
from rill.asgi.http.primitives import send_response
from rill.asgi.http.router import HTTPRequest
from rill.asgi.output.ollama_format import OllamaAnswer, created_at
from rill.asgi.output.respond import respond
from rill.asgi.prompt.encoding import tokenize_prompts
from rill.asgi.prompt.fim import fim_prompts
from rill.asgi.prompt.inputs import input_prompts, pooling
from rill.asgi.requests.body import decode_json
from rill.asgi.requests.generation_plan import plan_generation
from rill.asgi.requests.model_choice import resolve_model
from rill.asgi.requests.ollama_request import (
    OLLAMA_NAMES,
    chat_decoder,
    chat_messages,
    chat_request,
    embed_decoder,
    generate_decoder,
    max_tokens,
    model_decoder,
    with_images,
)
from rill.asgi.requests.schemas import ChatMessage
from rill.asgi.routes.tokenize import VERSION
from rill.asgi.state import WorkerState
from rill.engine_proc.encoder_engine import weight_bytes

PREFIX = "/api/"


def ollama_error(message: str) -> bytes:
    return msgspec.json.encode({"error": message})


async def chat(http: HTTPRequest) -> None:
    state: WorkerState = http.state
    req = decode_json(chat_decoder, http.body)
    lora = await _model(state, req.model)
    log_request_content(state.settings.http.log_requests, req)
    if not req.messages:  # Ollama's way to load a model: done at once
        return await _loaded(http, req.model, {"message": {"role": "assistant", "content": ""}})
    await _run(http, req, chat_request(req, chat_messages(req)), lora, is_chat=True)


async def generate(http: HTTPRequest) -> None:
    state: WorkerState = http.state
    req = decode_json(generate_decoder, http.body)
    lora = await _model(state, req.model)
    log_request_content(state.settings.http.log_requests, req)
    if not req.prompt and not req.suffix:
        return await _loaded(http, req.model, {"response": ""})
    if req.template is not None:
        raise APIError(400, "`template` is not supported: the model's own chat template (or --chat-template) "
                            "writes the prompt; send `raw` true for a prompt written by hand.", param="template")
    prompt_ids = None
    limits = state.settings.limits
    if req.suffix:  # fill in the middle, in the model's own FIM tokens
        if state.fim_tokens is None:
            raise APIError(400, "`suffix` needs a model trained for fill-in-the-middle: the served model's tokenizer "
                                "has no FIM tokens.", param="suffix")
        [prompt_ids] = await fim_prompts(state.tokenizer, state.fim_tokens, [req.prompt], req.suffix, limits.vocab_size)
    elif req.raw:
        [prompt_ids] = await tokenize_prompts(state.tokenizer, [req.prompt], limits.vocab_size, "prompt")
    if req.images and prompt_ids is not None:
        raise APIError(400, "`images` need the chat template to place them: not with `raw` or `suffix`.", param="images")
    messages = [*([ChatMessage(role="system", content=req.system)] if req.system else []),
                ChatMessage(role="user", content=with_images(req.prompt, req.images))]
    await _run(http, req, chat_request(req, messages), lora, is_chat=False, prompt_ids=prompt_ids)


async def _run(http: HTTPRequest, req, chat, lora: str, *, is_chat: bool, prompt_ids: list[int] | None = None) -> None:
    state: WorkerState = http.state
    try:  # checked as a chat completion's fields, named as Ollama's
        plan = await plan_generation(state, chat, max_tokens=max_tokens(req), prompt_ids=prompt_ids,
                                     prompt_param="messages" if is_chat else "prompt",
                                     max_tokens_param="options.num_predict", stop=chat.stop, lora=lora)
    except APIError as exc:
        raise renamed(exc, OLLAMA_NAMES) from None
    gen = Generation(state.client, new_request_id("ollama"), [plan.prompt_ids], plan.params, plan.make_detok,
                     return_token_ids=not is_chat)
    shape = OllamaAnswer(req.model, plan.make_parser(), chat=is_chat,
                         context=None if is_chat else list(plan.prompt_ids))
    await respond(gen, shape, stream=req.stream, receive=http.receive, send=http.send,
                  keepalive_s=state.settings.http.sse_keepalive_s)


async def _loaded(http: HTTPRequest, model: str, fields: dict) -> None:
    body = {"model": model, "created_at": created_at(), **fields, "done": True, "done_reason": "load"}
    await send_response(http.send, 200, msgspec.json.encode(body))


async def _model(state: WorkerState, name: str, adapters: bool = True) -> str:
    """resolve_model's answer for an Ollama name, whose `:latest` tag clients add to a name without one."""
    if name.endswith(":latest") and name not in state.model_names and name not in state.lora_names:
        name = name.removesuffix(":latest")
    return await resolve_model(state, name, adapters=adapters)


class _Embeddings:
    """The Shape of /api/embed's answer (`embeddings`), or of the older /api/embeddings' (`embedding`)."""

    ends_with_done = False
    opens_with_first_token = False

    def __init__(self, model: str, older: bool) -> None:
        self.model, self.older, self.started = model, older, time.perf_counter_ns()

    def add(self, deltas) -> None:
        pass

    def body(self, gen: Generation) -> bytes | None:
        if gen.disconnected:
            return None
        if any(c.embedding is None for c in gen.mailbox.choices):
            raise GenerationFailed("The engine returned no embedding.")
        vectors = [np.frombuffer(c.embedding, dtype="<f4").tolist() for c in gen.mailbox.choices]
        if self.older:
            return msgspec.json.encode({"embedding": vectors[0]})
        return msgspec.json.encode({"model": self.model, "embeddings": vectors,
                                    "total_duration": time.perf_counter_ns() - self.started, "load_duration": 0,
                                    "prompt_eval_count": gen.usage().prompt_tokens})


async def embed(http: HTTPRequest) -> None:
    await _embed(http, older=False)


async def embeddings(http: HTTPRequest) -> None:
    await _embed(http, older=True)


async def _embed(http: HTTPRequest, *, older: bool) -> None:
    state: WorkerState = http.state
    req = decode_json(embed_decoder, http.body)
    await _model(state, req.model, adapters=False)
    limits = state.settings.limits
    if not limits.embedding_dim or limits.scorer:
        raise APIError(400, "This server does not serve embeddings: start it with --enable-embeddings, or serve "
                            "an embedding model.", param="model", code="unsupported_model")
    text = req.prompt if older else req.input
    if older and text is None:
        raise APIError(400, "`prompt` is required.", param="prompt")
    inputs = SimpleNamespace(input=text, add_special_tokens=True, priority=0,
                             truncate_prompt_tokens=-1 if req.truncate else None)
    gen = pooling(state, inputs, await input_prompts(state, inputs), "embd")
    await respond(gen, _Embeddings(req.model, older), stream=False, receive=http.receive, send=http.send,
                  keepalive_s=state.settings.http.sse_keepalive_s)


@functools.cache
def _model_facts(model_dir: str) -> tuple[str, int]:
    """The served model's family (config.json's model_type) and its weight files' size, read once per worker."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    family = config.get("model_type") if isinstance(config, dict) else None
    return str(family or ""), weight_bytes(Path(model_dir))


def _details(state: WorkerState) -> dict:
    family = _model_facts(state.settings.limits.model_dir)[0]
    return {"parent_model": "", "format": "safetensors", "family": family,
            "families": [family] if family else None, "parameter_size": "",
            "quantization_level": state.settings.limits.quantization if state.settings.limits.quantization != "none"
            else state.settings.limits.dtype}


def _card(state: WorkerState, name: str) -> dict:
    size = _model_facts(state.settings.limits.model_dir)[1]
    modified = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(state.settings.created or time.time()))
    return {"name": name, "model": name, "modified_at": modified, "size": size,
            "digest": hashlib.sha256(name.encode()).hexdigest(), "details": _details(state)}


async def tags(http: HTTPRequest) -> None:
    state: WorkerState = http.state
    await send_response(http.send, 200, msgspec.json.encode({"models": [_card(state, n) for n in state.model_names]}))


async def running(http: HTTPRequest) -> None:
    """/api/ps: the served model, always loaded."""
    state: WorkerState = http.state
    cards = [{**_card(state, n), "expires_at": "2999-01-01T00:00:00Z", "size_vram": 0,
              "context_length": state.settings.limits.max_model_len} for n in state.model_names]
    await send_response(http.send, 200, msgspec.json.encode({"models": cards}))


async def version(http: HTTPRequest) -> None:
    await send_response(http.send, 200, msgspec.json.encode({"version": VERSION}))


async def show(http: HTTPRequest) -> None:
    state: WorkerState = http.state
    req = decode_json(model_decoder, http.body)
    await _model(state, req.model or req.name)
    limits, settings = state.settings.limits, state.settings.http
    family = _details(state)["family"] or "unknown"
    capabilities = [name for name, has in (
        ("completion", limits.generates), ("tools", bool(settings.tool_call_parser)),
        ("thinking", bool(settings.reasoning_parser)), ("insert", limits.generates and state.fim_tokens is not None),
        ("embedding", bool(limits.embedding_dim))) if has]
    body = {"modelfile": "", "parameters": "", "template": state.template.source if limits.generates else "",
            "details": _details(state), "capabilities": capabilities,
            "model_info": {"general.architecture": family, f"{family}.context_length": limits.max_model_len},
            "modified_at": _card(state, state.model_id)["modified_at"]}
    await send_response(http.send, 200, msgspec.json.encode(body))
