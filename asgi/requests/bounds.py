"""The bounds on request bodies' lists, maps and strings, in one place (the table is in docs/endpoints.md).

Each is far above what a real client sends and bounds the work one request can cause before the
engine sees it (template rendering, tokenizing, per-choice objects, grammar compiles) or in every
step after (stop ids, bias entries). Free-form text (message content, prompts, descriptions) is
bounded by --max-request-body and then by the context length; free-form JSON by its nesting
(asgi/requests/nesting.py). A field over its bound is a 400 naming it (msgspec's Meta, or a check).
"""
from __future__ import annotations

from typing import Annotated

from msgspec import Meta

MAX_NAME_LEN = 256  # names, ids, roles, types, `user`: OpenAI's function names are 64
MAX_MESSAGES = 4096  # chat messages, Responses input items, Messages API messages
MAX_CONTENT_PARTS = 1024  # content parts or blocks of one message
MAX_TOOLS = 128  # OpenAI's limit
MAX_TOOL_CALLS = 128  # tool calls of one assistant message
MAX_STOP = 16  # stop strings (OpenAI takes 4); each is searched in every piece of output
MAX_STOP_LEN = 1024  # characters of one stop string: the detokenizer holds back that many
MAX_STOP_TOKEN_IDS = 64  # checked for every sampled token
MAX_LOGIT_BIAS = 1024  # entries, each a logit added every step (OpenAI takes 300)
MAX_BAD_WORDS = 64  # vLLM's bad_words: each compared with the end of the output every step
MAX_BAD_WORD_LEN = 256  # characters of one
MAX_ALLOWED_TOKEN_IDS = 16_384  # vLLM's allowed_token_ids: sent with each of up to 128 choices, masked every step
MAX_PROMPTS = 2048  # completions prompts and embeddings inputs (OpenAI's embeddings limit)
MAX_CHOICES = 2048  # completions prompts x n: each choice is an engine request and a set of objects
MAX_TEMPLATE_KWARGS = 64  # chat_template_kwargs entries
MAX_CHAT_DOCUMENTS = 256  # chat `documents` (vLLM's, for RAG templates), each rendered into the prompt
MAX_METADATA = 16  # metadata entries (OpenAI's limit)
# OpenAI's metadata: 16 pairs, keys up to 64 characters, values up to 512.
Metadata = Annotated[dict[Annotated[str, Meta(max_length=64)], Annotated[str, Meta(max_length=512)]],
                     Meta(max_length=MAX_METADATA)]
MAX_SMALL_LIST = 16  # include, modalities, nvext annotations and extra fields: a few known names
MAX_CHAT_TEMPLATE_LEN = 256 * 1024  # a request's own chat template (real ones are under 30 KiB)
# A structured output's grammar (a schema, regex, grammar or choice list as JSON text) is compiled
# to check it (on a thread) and again in the engine: 2,000 properties (57 KB) took 1.0 s here,
# 10,000 (289 KB) 36 s.
MAX_CONSTRAINT_LEN = 64 * 1024
MAX_LORA_PATH_LEN = 4096  # PATH_MAX
# Top logprobs a token: the server's --max-logprobs (20, vLLM's default; sampling.py checks it) is the real bound,
# this one only what a body may spell (no vocabulary is as large).
MAX_LOGPROBS_FIELD = 1 << 20

Name = Annotated[str, Meta(max_length=MAX_NAME_LEN)]
LogprobsCount = Annotated[int, Meta(ge=0, le=MAX_LOGPROBS_FIELD)]
StopString = Annotated[str, Meta(max_length=MAX_STOP_LEN)]
# vLLM's truncate_prompt_tokens: -1 (the context length) or k; 0 and k past the context refused in
# asgi/prompt/truncation.py, where the context length is known
TruncatePromptTokens = Annotated[int, Meta(ge=-1, le=2**63 - 1)]
