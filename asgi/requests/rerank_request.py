"""The rerank request (Jina's and Cohere's `POST /v1/rerank`, `/v2/rerank`, vLLM's `/rerank`) and
vLLM's score request (`POST /score`), checked field by field, and the pairs each asks to score."""
from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from rill.asgi.errors import APIError, unsupported
from rill.asgi.requests.bounds import MAX_PROMPTS, MAX_SMALL_LIST, Name, TruncatePromptTokens
from rill.asgi.requests.classify_request import ClassifyRequest

MAX_DOCUMENTS = MAX_PROMPTS  # documents of one rerank, or pairs of one score request (Jina's and Cohere's are 1,000-2,048)
MAX_INSTRUCTION_LEN = 4096  # characters of a decoder reranker's instruction (Qwen3-Reranker's `<Instruct>`)
Instruction = Annotated[str, Meta(max_length=MAX_INSTRUCTION_LEN)]


class Document(msgspec.Struct, kw_only=True):
    """A document as an object (Cohere's v1, Jina's): only its `text` is ranked; other fields are kept out."""

    text: str


class RerankRequest(msgspec.Struct, kw_only=True):
    model: str | None = None  # optional, as vLLM and Cohere's v1 have it; compared only (a long name is a 404)
    query: str
    documents: Annotated[list[str | Document], Meta(max_length=MAX_DOCUMENTS)]
    top_n: Annotated[int, Meta(ge=0)] | None = None  # None or 0: every document (vLLM's 0)
    return_documents: bool = True  # vLLM and Jina return them; Cohere's v1 asks
    use_activation: bool | None = None  # vLLM's: false gives the classifier's raw logit
    activation: bool | None = None  # vLLM's older name for use_activation
    rank_fields: Annotated[list[Name], Meta(max_length=MAX_SMALL_LIST)] | None = None  # Cohere's v1
    instruction: Instruction | None = None  # a decoder reranker's task description (Rill's; vLLM's template variable)
    user: Name | None = None
    # vLLM's: each pair's prompt cut to k tokens, the document's end first (asgi/prompt/pairs.py)
    truncate_prompt_tokens: TruncatePromptTokens | None = None
    max_tokens_per_doc: Annotated[int, Meta(ge=1, le=2**63 - 1)] | None = None  # Cohere's: each document's end cut


TextOrTexts = str | Annotated[list[str], Meta(max_length=MAX_DOCUMENTS)]


class ScoreRequest(msgspec.Struct, kw_only=True):
    model: str | None = None
    text_1: TextOrTexts
    text_2: TextOrTexts
    use_activation: bool | None = None
    activation: bool | None = None
    instruction: Instruction | None = None
    user: Name | None = None
    truncate_prompt_tokens: TruncatePromptTokens | None = None  # as RerankRequest's


rerank_decoder = msgspec.json.Decoder(RerankRequest)
score_decoder = msgspec.json.Decoder(ScoreRequest)


def rerank_pairs(req: RerankRequest) -> tuple[list[str], list[str]]:
    """(queries, documents), one entry per pair: the query with each document."""
    if req.rank_fields not in (None, ["text"]):
        raise unsupported("rank_fields")  # Cohere's default, `text`, is the one field ranked
    if not req.documents:
        raise APIError(400, "`documents` must not be empty.", param="documents")
    texts = [d if isinstance(d, str) else d.text for d in req.documents]
    return [req.query] * len(texts), texts


def score_pairs(req: ScoreRequest) -> tuple[list[str], list[str]]:
    """vLLM's pairing: one `text_1` scores against every `text_2`; lists of equal length pair up by index."""
    first = [req.text_1] if isinstance(req.text_1, str) else req.text_1
    second = [req.text_2] if isinstance(req.text_2, str) else req.text_2
    if not first:
        raise APIError(400, "`text_1` must not be empty.", param="text_1")
    if not second:
        raise APIError(400, "`text_2` must not be empty.", param="text_2")
    if len(first) == 1:
        return first * len(second), second
    if len(first) != len(second):
        raise APIError(400, f"`text_1` holds {len(first)} texts and `text_2` {len(second)}: give one `text_1`, "
                            "or as many as `text_2`.", param="text_2")
    return first, second


def use_activation(req: RerankRequest | ScoreRequest | ClassifyRequest) -> bool:
    """Whether the score is the model's activated one (the default) or its raw logit."""
    chosen = req.use_activation if req.use_activation is not None else req.activation
    return chosen is not False
