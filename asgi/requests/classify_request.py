"""vLLM's classification request (`POST /classify`, also served by SGLang as `/v1/classify`) and its pooling request
(`POST /pooling`, the same fields and an `encoding_format`), checked field by field."""
from __future__ import annotations

from typing import Any, Literal

import msgspec

from rill.asgi.requests.bounds import Name, TruncatePromptTokens
from rill.asgi.requests.priority import Priority
from rill.asgi.requests.schemas import ChatCompletionRequest


class ClassifyRequest(msgspec.Struct, kw_only=True):
    """A text, texts or token ids, each one input."""

    model: str | None = None  # optional, as in vLLM; compared only (a long name is a 404)
    input: str | list[Any]  # a string, strings, token ids, or lists of token ids (schemas.prompt_batch)
    use_activation: bool | None = None  # vLLM's: false gives the raw logits instead of probabilities
    activation: bool | None = None  # vLLM's older name for use_activation
    user: Name | None = None
    priority: Priority = 0  # vLLM's (asgi/requests/priority.py)
    truncate_prompt_tokens: TruncatePromptTokens | None = None  # each input's last k tokens (-1: the context length)
    add_special_tokens: bool = True  # the tokenizer's own around each text ([CLS] and [SEP], a BOS)
    encoding_format: Literal["float", "base64"] = "float"  # /pooling's: base64, the little-endian float32 bytes


class ClassifyChat(ChatCompletionRequest, kw_only=True):
    """vLLM's chat form: `messages` rendered by the chat template into one input (a reward model's conversation),
    with chat's fields that shape a prompt; no generation prompt unless asked, as vLLM's."""

    model: str | None = None
    add_generation_prompt: bool | None = False
    use_activation: bool | None = None
    activation: bool | None = None
    encoding_format: Literal["float", "base64"] = "float"


classify_decoder = msgspec.json.Decoder(ClassifyRequest)
classify_chat_decoder = msgspec.json.Decoder(ClassifyChat)
