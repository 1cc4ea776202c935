"""The stored shape of an item: only the fields OpenAI's API defines for it, checked by msgspec.

Whatever else a client sends with an item (unknown fields, extra keys in a content part) is
dropped before the item is stored or echoed, so a stored item costs what the API can show of it.
Fields the client left out stay out (UNSET), so an item reads back as it was sent, less the rest.
"""
from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from rill.asgi.errors import APIError

# The shape of every id the server mints (msg_<hex>, fc_<hex>, ...); a client's own item id must
# have it too, as OpenAI asks ("Expected an ID that begins with 'msg'"), so no id is odd in a key.
# `\Z`, not `$`: msgspec searches, and `$` also matches before a final newline.
ITEM_ID = r"^[A-Za-z]{1,16}_[A-Za-z0-9_-]{1,128}\Z"
RESPONSE_ID = r"^resp_[A-Za-z0-9_-]{1,128}\Z"
CONVERSATION_ID = r"^conv_[A-Za-z0-9_-]{1,128}\Z"
ItemId = Annotated[str, Meta(pattern=ITEM_ID)]
Status = Literal["in_progress", "completed", "incomplete"]


class Refused(APIError):
    """The store keeps no such thing (an item of an unknown shape, an entry past its bytes, a
    full conversation): a 400 naming the field."""

    def __init__(self, message: str, param: str | None, code: str = "invalid_value"):
        super().__init__(400, message, param=param, code=code)


class _Shape(msgspec.Struct, kw_only=True, tag_field="type"):
    pass


class FileCitation(_Shape, tag="file_citation"):
    file_id: str | UnsetType = UNSET
    filename: str | UnsetType = UNSET
    index: int | UnsetType = UNSET


class UrlCitation(_Shape, tag="url_citation"):
    url: str | UnsetType = UNSET
    title: str | UnsetType = UNSET
    start_index: int | UnsetType = UNSET
    end_index: int | UnsetType = UNSET


class ContainerFileCitation(_Shape, tag="container_file_citation"):
    container_id: str | UnsetType = UNSET
    file_id: str | UnsetType = UNSET
    filename: str | UnsetType = UNSET
    start_index: int | UnsetType = UNSET
    end_index: int | UnsetType = UNSET


class FilePath(_Shape, tag="file_path"):
    file_id: str | UnsetType = UNSET
    index: int | UnsetType = UNSET


Annotation = FileCitation | UrlCitation | ContainerFileCitation | FilePath


class TopLogProb(msgspec.Struct, kw_only=True):
    token: str | UnsetType = UNSET
    logprob: float | UnsetType = UNSET
    bytes: list[int] | None | UnsetType = UNSET


class LogProb(msgspec.Struct, kw_only=True):
    token: str | UnsetType = UNSET
    logprob: float | UnsetType = UNSET
    bytes: list[int] | None | UnsetType = UNSET
    top_logprobs: list[TopLogProb] | UnsetType = UNSET


class InputText(_Shape, tag="input_text"):
    text: str


class OutputText(_Shape, tag="output_text"):
    text: str
    annotations: list[Annotation] | UnsetType = UNSET
    logprobs: list[LogProb] | None | UnsetType = UNSET


class Text(_Shape, tag="text"):
    text: str


class SummaryText(_Shape, tag="summary_text"):
    text: str


class ReasoningText(_Shape, tag="reasoning_text"):
    text: str


class InputImage(_Shape, tag="input_image"):  # a vision model's (docs/vision.md)
    image_url: str | None = None  # a data URL; a file_id is refused
    file_id: str | None = None
    detail: Literal["low", "high", "auto"] = "auto"


# The parts the Responses input accepts (asgi/requests/responses_input.py TEXT_PARTS, and images).
Part = InputText | OutputText | Text | SummaryText | ReasoningText | InputImage


class Message(_Shape, tag="message"):
    id: ItemId
    role: Literal["user", "assistant", "system", "developer"]
    content: list[Part]
    status: Status | UnsetType = UNSET
    phase: str | None | UnsetType = UNSET


class FunctionCall(_Shape, tag="function_call"):
    id: ItemId
    call_id: str
    name: str
    arguments: str
    namespace: str | UnsetType = UNSET
    status: Status | UnsetType = UNSET


class FunctionCallOutput(_Shape, tag="function_call_output"):
    id: ItemId
    call_id: str
    output: str | list[Part]
    status: Status | UnsetType = UNSET


class Reasoning(_Shape, tag="reasoning"):
    id: ItemId
    summary: list[Part] | UnsetType = UNSET
    content: list[Part] | UnsetType = UNSET
    encrypted_content: str | None | UnsetType = UNSET
    status: Status | UnsetType = UNSET


Item = Message | FunctionCall | FunctionCallOutput | Reasoning


def stored_items(items: list[dict], param: str) -> list[dict]:
    """Each item with only its defined fields; a 400 naming `param[i]...` for one that has a
    field of the wrong type or an id of another shape."""
    try:
        return msgspec.to_builtins(msgspec.convert(items, list[Item]))
    except msgspec.ValidationError as exc:
        text = str(exc)
        where = text.rpartition(" - at `$")[2].rstrip("`") if " - at `$" in text else ""
        raise Refused(f"{text.partition(' - at ')[0]} - at `{param}{where}`", f"{param}{where}") from None
