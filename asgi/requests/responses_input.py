"""Responses input items -> chat messages, and the request as a ChatCompletionRequest for the chat path.

Items: `message` (a string, or input_text / output_text parts, and for a vision model input_image parts with an
`image_url`: docs/vision.md), `function_call` (an assistant's
tool call), `function_call_output` (a tool message), `reasoning` (attached to the next assistant
message, as templates that show thinking take it: its content, or the text sealed in its `encrypted_content`). Each input item gets an id, kept for
GET /v1/responses/{id}/input_items.
"""
from __future__ import annotations

import uuid
from typing import Any

from rill.asgi.errors import APIError
from rill.asgi.requests.bounds import MAX_CONTENT_PARTS
from rill.asgi.requests.reasoning_blob import unseal
from rill.asgi.requests.responses_request import ResponsesRequest, wants_logprobs
from rill.asgi.requests.schemas import ChatCompletionRequest, chat_from
from rill.asgi.requests.thinking import effort_of

TEXT_PARTS = ("input_text", "output_text", "text", "reasoning_text", "summary_text")
ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def new_item_id(kind: str) -> str:
    return f"{ID_PREFIX.get(kind, 'item')}_{uuid.uuid4().hex}"


def input_items(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's input as typed items with ids (a string becomes one user message)."""
    if req.input is None:
        return []
    if isinstance(req.input, str):
        return [{"id": new_item_id("message"), "type": "message", "role": "user", "status": "completed",
                 "content": [{"type": "input_text", "text": req.input}]}]
    return typed_items(req.input, "input")


def typed_items(raw_items: list[dict[str, Any]], param: str) -> list[dict[str, Any]]:
    """Items as stored and listed: each with its type, an id, a status, and parts for a string content."""
    items = []
    for i, raw in enumerate(raw_items):
        kind = raw.get("type", "message" if "role" in raw else None)
        if kind not in ID_PREFIX:
            raise APIError(400, f"Input items of type `{kind}` are not supported; only message, function_call, "
                                "function_call_output and reasoning.", param=f"{param}[{i}].type",
                           code="unsupported_parameter")
        item = {**raw, "type": kind}
        if kind == "message" and isinstance(item.get("content"), str):
            part = "output_text" if item.get("role") == "assistant" else "input_text"
            item["content"] = [{"type": part, "text": item["content"]}]
        item.setdefault("id", new_item_id(kind))
        if kind != "reasoning":
            item.setdefault("status", "completed")
        items.append(item)
    return items


def items_to_messages(items: list[dict[str, Any]], param: str = "input", images: bool = False) -> list[dict[str, Any]]:
    """Chat messages (ChatMessage fields) for typed items; a function_call joins the assistant
    message before it, as chat sends a turn's text and its calls in one message. `images`: the served model takes
    input_image parts (else each is a 400)."""
    messages: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for i, item in enumerate(items):
        where = f"{param}[{i}]"
        kind = item["type"]
        if kind == "reasoning":  # its content, else the text sealed in its encrypted_content, else its summary
            text = _text(item.get("content"), f"{where}.content") or \
                unseal(item.get("encrypted_content"), f"{where}.encrypted_content") or \
                _text(item.get("summary"), f"{where}.summary")
            if text:
                reasoning.append(text)
        elif kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise APIError(400, f"A message's role is user, system, developer or assistant; got `{role}`.",
                               param=f"{where}.role")
            message = {"role": role, "content": _content(item.get("content"), f"{where}.content", images)}
            if role == "assistant" and reasoning:
                message["reasoning"], reasoning = "\n".join(reasoning), []
            messages.append(message)
        elif kind == "function_call":
            for field in ("call_id", "name", "arguments"):
                if not isinstance(item.get(field), str):
                    raise APIError(400, f"A function_call item needs `{field}` (a string).", param=f"{where}.{field}")
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": None}
                messages.append(last)
            if reasoning:
                last["reasoning"], reasoning = "\n".join(reasoning), []
            last.setdefault("tool_calls", []).append(call)
        else:  # function_call_output
            if not isinstance(item.get("call_id"), str):
                raise APIError(400, "A function_call_output item needs `call_id`.", param=f"{where}.call_id")
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output, f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
    return messages


def _content(content: Any, where: str, images: bool) -> str | list[dict[str, Any]]:
    """A message's text, or where it has input_image parts (a vision model's), chat's text and image_url parts."""
    if not (isinstance(content, list) and any(isinstance(p, dict) and p.get("type") == "input_image"
                                                for p in content)):
        return _text(content, where)
    if len(content) > MAX_CONTENT_PARTS:
        raise APIError(400, f"Content holds {len(content)} parts; at most {MAX_CONTENT_PARTS}.", param=where)
    parts = []
    for j, part in enumerate(content):
        if not (isinstance(part, dict) and part.get("type") == "input_image"):
            parts.append({"type": "text", "text": _text([part], f"{where}[{j}]")})
        elif not images:
            raise APIError(400, "The served model takes no images.", param=f"{where}[{j}].type",
                           code="unsupported_parameter")
        elif not isinstance(part.get("image_url"), str):
            raise APIError(400, "An input_image part needs `image_url` (a base64 data URL); `file_id` is not "
                                "served.", param=f"{where}[{j}].image_url")
        else:
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
    return parts


def _text(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise APIError(400, "Content must be a string or a list of parts.", param=where)
    if len(content) > MAX_CONTENT_PARTS:
        raise APIError(400, f"Content holds {len(content)} parts; at most {MAX_CONTENT_PARTS}.", param=where)
    texts = []
    for j, part in enumerate(content):
        if isinstance(part, dict) and part.get("type") in TEXT_PARTS and not isinstance(part.get("text"), str):
            raise APIError(400, f"A `{part['type']}` part needs `text` (a string).", param=f"{where}[{j}].text")
        if not isinstance(part, dict) or part.get("type") not in TEXT_PARTS:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise APIError(400, f"Content parts of type `{kind}` are not supported; only input_text and "
                                "output_text.", param=f"{where}[{j}].type", code="unsupported_parameter")
        texts.append(part["text"])
    return "\n".join(texts)


def chat_request(req: ResponsesRequest, messages: list[dict[str, Any]]) -> ChatCompletionRequest:
    """The chat request that builds this response's prompt and sampling parameters."""
    if req.instructions:
        messages = [{"role": "system", "content": req.instructions}, *messages]
    if not messages:
        raise APIError(400, "`input` must hold at least one item.", param="input")
    body: dict[str, Any] = {"model": req.model, "messages": messages, "temperature": req.temperature,
                            "top_p": req.top_p, "max_completion_tokens": req.max_output_tokens,
                            "parallel_tool_calls": req.parallel_tool_calls,
                            "user": req.safety_identifier or req.user, "priority": req.priority}
    if wants_logprobs(req) or req.top_logprobs:
        body["logprobs"], body["top_logprobs"] = True, req.top_logprobs or 0
    if req.tools:
        body["tools"] = [{"type": "function", "function": {k: v for k, v in (
            ("name", t.name), ("description", t.description), ("parameters", t.parameters), ("strict", t.strict))
            if v is not None}} for t in req.tools]
    if req.tool_choice is not None:
        body["tool_choice"] = _tool_choice(req.tool_choice)
    if isinstance(req.reasoning, dict) and req.reasoning.get("effort") is not None:
        body["reasoning_effort"] = effort_of(req.reasoning["effort"], "reasoning.effort")
    return chat_from(body, "input")


def _tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and not isinstance(choice.get("name"), str):
        raise APIError(400, "A function `tool_choice` needs `name`.", param="tool_choice.name")
    if choice.get("type") != "function":
        raise APIError(400, f"`tool_choice` of type `{choice.get('type')}` is not supported; only "
                            'none, auto, required or {"type": "function", "name": ...}.', param="tool_choice")
    return {"type": "function", "function": {"name": choice["name"]}}

