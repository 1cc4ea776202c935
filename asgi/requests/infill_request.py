"""llama.cpp's `POST /infill` request (what llama.vim, llama.vscode and other editors send), and its prompt.

Fill-in-the-middle with context: `input_prefix` and `input_suffix` around the cursor, `input_extra` (other files'
text, `[{"filename", "text"}]`) before them, and `prompt` (the start of the middle, after the middle token). The
sampling fields are llama.cpp's, as `/completion` takes them (asgi/requests/llama_request.py).
"""
from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from rill.asgi.prompt.encoding import encode_texts
from rill.asgi.prompt.fim import FimTokens
from rill.asgi.requests.bounds import MAX_SMALL_LIST, Name
from rill.asgi.requests.llama_request import LlamaSampling

MAX_EXTRA_CHUNKS = 4 * MAX_SMALL_LIST  # other files' chunks (llama.vim keeps up to 16 by default)


class ExtraChunk(msgspec.Struct):
    text: str = ""
    filename: Name = "tmp"


class InfillRequest(LlamaSampling, kw_only=True):
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: Annotated[list[ExtraChunk], Meta(max_length=MAX_EXTRA_CHUNKS)] = []
    prompt: str = ""


infill_decoder = msgspec.json.Decoder(InfillRequest)


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
