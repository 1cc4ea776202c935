"""llama.cpp's `POST /infill` request (what llama.vim, llama.vscode and other editors send), and its prompt.

Fill-in-the-middle with context: `input_prefix` and `input_suffix` around the cursor, `input_extra` (other files'
text, `[{"filename", "text"}]`) before them, and `prompt` (the start of the middle, after the middle token). The
sampling fields are llama.cpp's names, mapped onto a completion request (`n_predict` -1: until the model stops or
the context is full). Fields this server does not read (`cache_prompt`, `samplers`, `t_max_predict_ms`, ...)
are ignored, as llama.cpp ignores what it does not know.
"""
from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from rill.asgi.prompt.encoding import encode_texts
from rill.asgi.prompt.fim import FimTokens
from rill.asgi.requests.bounds import MAX_SMALL_LIST, MAX_STOP, Name, StopString
from rill.asgi.requests.cache_salt import CacheSalt
from rill.asgi.requests.priority import Priority
from rill.asgi.requests.schemas import INT64_MAX, INT64_MIN, CompletionRequest

MAX_EXTRA_CHUNKS = 4 * MAX_SMALL_LIST  # other files' chunks (llama.vim keeps up to 16 by default)


class ExtraChunk(msgspec.Struct):
    text: str = ""
    filename: Name = "tmp"


class InfillRequest(msgspec.Struct, kw_only=True):
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: Annotated[list[ExtraChunk], Meta(max_length=MAX_EXTRA_CHUNKS)] = []
    prompt: str = ""
    model: str | None = None
    n_predict: Annotated[int, Meta(ge=-1, le=INT64_MAX)] = -1
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_k: Annotated[int, Meta(ge=-1, le=INT64_MAX)] | None = None
    top_p: Annotated[float, Meta(gt=0, le=1)] | None = None
    min_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    repeat_penalty: Annotated[float, Meta(gt=0, le=2)] | None = None
    seed: Annotated[int, Meta(ge=INT64_MIN, le=INT64_MAX)] | None = None
    stop: Annotated[list[StopString], Meta(max_length=MAX_STOP)] | None = None
    ignore_eos: bool = False
    stream: bool = False
    cache_salt: CacheSalt | None = None  # vLLM's: a namespace of its own in the prefix cache (asgi/requests/cache_salt.py)
    priority: Priority = 0  # vLLM's, under --scheduling-policy priority (asgi/requests/priority.py)


infill_decoder = msgspec.json.Decoder(InfillRequest)


def as_completion(req: InfillRequest, model: str, prompt_ids: list[int], max_tokens: int) -> CompletionRequest:
    """The completion request the infill runs as (its sampling fields checked as completions' are)."""
    return CompletionRequest(model=model, prompt=prompt_ids, max_tokens=max_tokens, temperature=req.temperature,
                             top_k=req.top_k if req.top_k not in (0, None) else None, top_p=req.top_p,
                             min_p=req.min_p, repetition_penalty=req.repeat_penalty,
                             seed=req.seed if req.seed not in (-1, None) else None,
                             stop=req.stop, ignore_eos=req.ignore_eos, stream=req.stream)


async def infill_prompt(tokenizer, fim: FimTokens, req: InfillRequest) -> list[int]:
    """llama.cpp's layout: [BOS] the extra context, then PRE prefix SUF suffix MID, then `prompt`. With the model's
    repository and file-separator tokens the context is `<repo_name>myproject\\n` and `<file_sep>NAME\\nTEXT` per
    chunk, then `<file_sep>filename\\n` for the file being edited; without, each chunk after a `--- snippet ---`
    line."""
    chunks = req.input_extra
    pieces = [req.input_prefix, req.input_suffix, req.prompt, *(c.text for c in chunks),
              *((f"{c.filename}\n" if fim.file_sep is not None else "\n\n--- snippet ---\n\n") for c in chunks),
              "myproject\n", "filename\n"]
    prefix, suffix, prompt, *rest = await encode_texts(tokenizer, pieces, add_special_tokens=False)
    texts, heads, (repo, current) = rest[:len(chunks)], rest[len(chunks):2 * len(chunks)], rest[2 * len(chunks):]
    extra: list[int] = [fim.repo_name, *repo] if fim.repo_name is not None else []
    for head, text in zip(heads, texts):
        extra += [*([fim.file_sep] if fim.file_sep is not None else []), *head, *text]
    if fim.file_sep is not None:
        extra += [fim.file_sep, *current]
    return [*fim.opening, *extra, *fim.layout(prefix, suffix), *prompt]
