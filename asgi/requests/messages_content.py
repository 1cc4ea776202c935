"""A Messages request's `system` and `messages` as chat messages, for the chat template.

Blocks taken: `text` anywhere; in assistant turns `tool_use` (an assistant tool call),
`thinking` (the turn's reasoning, for templates that show it) and `redacted_thinking` (left out:
it is opaque); in user turns `tool_result` (a `tool` message answering the call with that id,
which must be a tool_use of the assistant turn just before, as Anthropic requires). A user turn's
tool results come first, as their own messages, then its text as one user message. A vision model's
user turns take `image` blocks too (base64 sources: docs/vision.md), as image_url parts among the text's. A user
turn's `document` blocks of text (a `text` or `content` source) become text in its place, in the tags Anthropic's
prompting guide uses for documents; a PDF, a URL or a file is refused naming its `source.type`, and `citations` (which
this server does not write) naming it. Other blocks are refused with a 400 naming `messages[i].content[j].type`.
"""
from __future__ import annotations

from typing import Any

from rill.asgi.errors import APIError
from rill.asgi.requests.bounds import MAX_CONTENT_PARTS

BLOCKS = {"user": ("text", "tool_result", "image", "document"),
          "assistant": ("text", "tool_use", "thinking", "redacted_thinking")}
# A tool_result's text says it reports an error this way: chat's tool message has no such field.
ERROR_PREFIX = "Error: "


def bad(field: str, message: str) -> APIError:
    return APIError(400, f"`{field}` {message}", param=field)


def chat_messages(system: Any, messages: list[dict[str, Any]], images: bool = False) -> list[dict[str, Any]]:
    """`images`: the served model takes them (else an image block is a 400)."""
    out: list[dict[str, Any]] = []
    if system is not None:
        out.append({"role": "system", "content": text_of(system, "system")})
    tool_use_ids: set[str] = set()  # those of the assistant turn just before
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = message.get("role")
        if role not in BLOCKS:
            raise bad(f"{where}.role", "must be user or assistant.")
        if "content" not in message:
            raise bad(f"{where}.content", "is required.")
        blocks = _blocks(message["content"], f"{where}.content", BLOCKS[role])
        if role == "assistant":
            turn = _assistant(blocks)
            tool_use_ids = {call["id"] for call in turn.get("tool_calls", [])}
            out.append(turn)
        else:
            out += _user(blocks, f"{where}.content", tool_use_ids, images)
            tool_use_ids = set()
    return out


def text_of(content: Any, where: str) -> str:
    """A string, or text blocks joined."""
    return "".join(block["text"] for block in _blocks(content, where, ("text",)))


def _blocks(content: Any, where: str, allowed: tuple[str, ...]) -> list[dict[str, Any]]:
    """The content as checked blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise bad(where, "must be a string or a list of content blocks.")
    if len(content) > MAX_CONTENT_PARTS:
        raise bad(where, f"holds {len(content)} blocks; at most {MAX_CONTENT_PARTS}.")
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind not in allowed:
            raise APIError(400, f"`{where}[{j}].type` {kind!r} is not supported here; this server takes "
                                f"{', '.join(allowed)} blocks.", param=f"{where}[{j}].type",
                           code="unsupported_parameter")
        for field, kind_of, name in _FIELDS.get(kind, ()):
            if not isinstance(block.get(field), kind_of):
                raise bad(f"{where}[{j}].{field}", f"must be {name}.")
    return content


# Each block type's fields that must be there: (field, Python type, what the error calls it).
_FIELDS = {
    "text": [("text", str, "a string")],
    "thinking": [("thinking", str, "a string")],
    "tool_use": [("id", str, "a string"), ("name", str, "a string"), ("input", dict, "an object")],
    "tool_result": [("tool_use_id", str, "a string")],
    "image": [("source", dict, "an object")],
    "document": [("source", dict, "an object")],
}


def _assistant(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant",
                               "content": "".join(b["text"] for b in blocks if b["type"] == "text")}
    calls = [{"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": b["input"]}}
             for b in blocks if b["type"] == "tool_use"]
    if calls:
        message["tool_calls"] = calls
    if thinking := "".join(b["thinking"] for b in blocks if b["type"] == "thinking"):
        message["reasoning"] = thinking
    return message


def _user(blocks: list[dict[str, Any]], where: str, tool_use_ids: set[str], images: bool) -> list[dict[str, Any]]:
    out = []
    blocks = [_document(b, f"{where}[{j}]") if b["type"] == "document" else b for j, b in enumerate(blocks)]
    for j, block in enumerate(blocks):
        if block["type"] != "tool_result":
            continue
        field = f"{where}[{j}]"
        if block["tool_use_id"] not in tool_use_ids:
            raise bad(f"{field}.tool_use_id", f"{block['tool_use_id']!r} answers no tool_use block of the "
                                              "assistant turn just before.")
        if not isinstance(block.get("is_error"), (bool, type(None))):
            raise bad(f"{field}.is_error", "must be a boolean.")
        content = block.get("content")
        text = "" if content is None else text_of(content, f"{field}.content")
        prefix = ERROR_PREFIX if block.get("is_error") else ""
        out.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": prefix + text})
    pictures = [_image_url(b, f"{where}[{j}]", images) for j, b in enumerate(blocks) if b["type"] == "image"]
    if pictures:  # the text and images in their order, as chat's content parts
        urls = iter(pictures)
        parts = [{"type": "text", "text": b["text"]} if b["type"] == "text" else {"type": "image_url",
                                                                                 "image_url": {"url": next(urls)}}
                 for b in blocks if b["type"] in ("text", "image")]
        return [*out, {"role": "user", "content": parts}]
    texts = [b["text"] for b in blocks if b["type"] == "text"]
    if texts or not out:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def _image_url(block: dict[str, Any], where: str, images: bool) -> str:
    """An image block's base64 source as a data URL (asgi/prompt/images.py decodes it)."""
    if not images:
        raise APIError(400, f"`{where}.type` 'image' is not supported here: the served model takes no images.",
                       param=f"{where}.type", code="unsupported_parameter")
    source = block["source"]
    if source.get("type") != "base64":
        raise bad(f"{where}.source.type", "must be base64: this server fetches no image URLs or files.")
    media_type, data = source.get("media_type"), source.get("data")
    if not isinstance(media_type, str) or not media_type.startswith("image/"):
        raise bad(f"{where}.source.media_type", "must be an image type, such as image/png.")
    if not isinstance(data, str):
        raise bad(f"{where}.source.data", "must be a string (base64).")
    return f"data:{media_type};base64,{data}"


def _document(block: dict[str, Any], where: str) -> dict[str, Any]:
    """A document block of text as a text block: its title and context, then its text, in tags."""
    source, kind = block["source"], block["source"].get("type")
    if kind == "text":
        if not isinstance(source.get("data"), str):
            raise bad(f"{where}.source.data", "must be a string.")
        text = source["data"]
    elif kind == "content":
        text = text_of(source.get("content"), f"{where}.source.content")
    else:
        raise bad(f"{where}.source.type", f"{kind!r} is not read here: send the document's text (a source of type "
                                          "text or content); this server reads no PDFs, URLs or files.")
    if isinstance(block.get("citations"), dict) and block["citations"].get("enabled"):
        raise bad(f"{where}.citations", "are not written by this server: send the document without them.")
    head = []
    for field, tag in (("title", "source"), ("context", "context")):
        if (value := block.get(field)) is not None:
            if not isinstance(value, str):
                raise bad(f"{where}.{field}", "must be a string.")
            head.append(f"<{tag}>{value}</{tag}>\n")
    return {"type": "text", "text": f"<document>\n{''.join(head)}<document_content>\n{text}\n</document_content>\n"
                                    "</document>\n"}
