"""OpenAI's embeddings request (`POST /v1/embeddings`), checked field by field."""
from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from rill.asgi.requests.bounds import MAX_PROMPTS, Name, TruncatePromptTokens
from rill.asgi.requests.priority import Priority

MAX_INPUTS = MAX_PROMPTS  # OpenAI's limit on the inputs of one request


class EmbeddingsRequest(msgspec.Struct, kw_only=True):
    model: str
    input: str | list[Any]  # a string, strings, token ids, or lists of token ids (schemas.prompt_batch)
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Meta(ge=1)] | None = None
    user: Name | None = None
    priority: Priority = 0  # vLLM's (asgi/requests/priority.py)
    # vLLM's: keep each input's last k tokens (-1: the context length; asgi/prompt/truncation.py)
    truncate_prompt_tokens: TruncatePromptTokens | None = None
    add_special_tokens: bool = True  # vLLM's: the tokenizer's own around each text ([CLS] and [SEP])


embeddings_decoder = msgspec.json.Decoder(EmbeddingsRequest)
