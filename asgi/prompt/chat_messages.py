"""Chat messages of a request -> the prompt's token ids, through the chat template.

What the template sees follows vLLM: content parts joined by newlines, null content as "",
an assistant's tool-call `arguments` (a JSON string in OpenAI's API) parsed into a dict since
templates iterate `arguments | items`, the tools as HF's apply_chat_template takes them.
"""
from __future__ import annotations

from typing import Any

from rill.asgi.errors import APIError
from rill.asgi.parsers.tools.auto import pick_tool_parser
from rill.asgi.prompt.encoding import encode_texts
from rill.asgi.prompt.templating import RESERVED_KWARGS, ChatTemplate, TemplateError, request_template
from rill.asgi.requests import nesting
from rill.asgi.requests.schemas import ChatCompletionRequest, ChatMessage
from rill.asgi.requests.thinking import effort_of, effort_template_kwargs
from rill.asgi.requests.tool_choice import template_tools
from rill.asgi.state import WorkerState
from rill.ipc.images import ImageInputs

ROLES = ("system", "developer", "user", "assistant", "tool")


async def render_messages(state: WorkerState, req: ChatCompletionRequest) -> list[int]:
    """The prompt's token ids (a large prompt is encoded off the event loop)."""
    return (await render_chat(state, req))[0]


async def render_chat(state: WorkerState, req: ChatCompletionRequest) -> tuple[list[int], ImageInputs | None]:
    """The prompt's token ids, and a vision model's images where the messages have some (asgi/prompt/vision.py)."""
    images: list[tuple[str, str]] = []
    text = render_prompt(state, req, images)
    add_special_tokens = bool(req.add_special_tokens)  # vLLM's default: the template's
    if images:
        return await state.vision.encode(text, images, add_special_tokens)
    (ids,) = await encode_texts(state.tokenizer, [text], add_special_tokens=add_special_tokens)
    return ids, None


def render_prompt(state: WorkerState, req: ChatCompletionRequest, images: list[tuple[str, str]] | None = None) -> str:
    """The chat template's text for the request's messages; 400s for what the template refuses. A vision model's
    image parts render as its placeholder, each (url, param) added to `images`."""
    template = _template(state, req)
    messages = template_messages(req.messages, has_developer_role="developer" in template.source,
                                 image_slot=state.vision.placeholder if state.vision else None, images=images)
    extra = req.chat_template_kwargs or {}
    if reserved := RESERVED_KWARGS & extra.keys():
        raise APIError(400, f"`chat_template_kwargs` must not set {sorted(reserved)}; use the request fields.",
                       param="chat_template_kwargs")
    # --default-chat-template-kwargs under reasoning_effort's (asgi/requests/thinking.py) under the request's own
    extra = {**state.settings.http.default_chat_template_kwargs, **effort_template_kwargs(effort_of(req.reasoning_effort)),
             **extra}
    if req.continue_final_message and req.add_generation_prompt:
        raise APIError(400, "`continue_final_message` and `add_generation_prompt` cannot both be true: "
                            "send add_generation_prompt false to continue the final message.",
                       param="continue_final_message")
    add_generation_prompt = not req.continue_final_message if req.add_generation_prompt is None \
        else req.add_generation_prompt
    try:
        text = template.render(messages, add_generation_prompt=add_generation_prompt,
                               continue_final_message=req.continue_final_message, tools=template_tools(req),
                               documents=req.documents, **extra)
    except TemplateError as exc:
        param = "chat_template" if req.chat_template is not None else "messages"
        raise APIError(400, f"The chat template could not render these messages: {exc}", param=param) from None
    return text


def tool_parser_name(state: WorkerState, req: ChatCompletionRequest) -> str | None:
    """--tool-call-parser, or with `auto` the one whose format the request's chat template writes
    (asgi/parsers/tools/auto.py): the served template's, or the request's own."""
    name = state.settings.http.tool_call_parser
    return pick_tool_parser(template_source(state, req)) if name == "auto" else name


def template_source(state: WorkerState, req: ChatCompletionRequest) -> str:
    """The source of the chat template a request renders with: the served one, or the request's own."""
    return _template(state, req).source


def _template(state: WorkerState, req: ChatCompletionRequest) -> ChatTemplate:
    if req.chat_template is None:
        return state.template
    if not state.settings.http.trust_request_chat_template:
        raise APIError(400, "A per-request `chat_template` is refused: this server was not started with "
                            "--trust-request-chat-template.", param="chat_template")
    try:
        return request_template(req.chat_template, state.template)
    except TemplateError as exc:
        raise APIError(400, f"The request's chat template does not compile: {exc}", param="chat_template") from None


def template_messages(messages: list[ChatMessage], *, has_developer_role: bool = True, image_slot: str | None = None,
                      images: list[tuple[str, str]] | None = None) -> list[dict[str, Any]]:
    """Messages as the template gets them. `developer` (OpenAI's newer name for system
    instructions) becomes `system` for a template that never mentions it; vLLM passes it on
    unchanged, which ChatML-style templates render as an unknown role. `image_slot`: a vision
    model's image placeholder, which an image part becomes (its url and param added to `images`);
    None: an image part is a 400."""
    out = []
    for i, m in enumerate(messages):
        if m.role not in ROLES:
            raise APIError(400, f"Unknown role `{m.role}`; a message's role is one of {', '.join(ROLES)}.",
                           param=f"messages[{i}].role")
        role = "system" if m.role == "developer" and not has_developer_role else m.role
        message: dict[str, Any] = {"role": role, "content": _text(m, i, image_slot, images)}
        if m.name is not None:
            message["name"] = m.name
        if m.role == "tool":
            if not m.tool_call_id:
                raise APIError(400, "A tool message needs the `tool_call_id` of the call it answers.",
                               param=f"messages[{i}].tool_call_id")
            message["tool_call_id"] = m.tool_call_id
        if m.role == "assistant" and m.tool_calls:
            message["tool_calls"] = [_tool_call(call, i, j) for j, call in enumerate(m.tool_calls)]
        if m.role == "assistant" and (reasoning := m.reasoning if m.reasoning is not None else m.reasoning_content):
            message["reasoning"] = message["reasoning_content"] = reasoning  # both names, as vLLM
        out.append(message)
    return out


def _text(m: ChatMessage, i: int, image_slot: str | None, images: list[tuple[str, str]] | None) -> str:
    if m.content is None:
        return ""
    if isinstance(m.content, str):
        return m.content
    texts = []
    for j, part in enumerate(m.content):
        if part.type == "image_url" and image_slot is not None:
            if part.image_url is None:
                raise APIError(400, "An image_url part needs `image_url` ({\"url\": \"data:image/png;base64,...\"}).",
                               param=f"messages[{i}].content[{j}].image_url")
            if images is not None:
                images.append((part.image_url.url, f"messages[{i}].content[{j}].image_url.url"))
            texts.append(image_slot)
            continue
        if part.type == "image_url":
            raise APIError(400, "The served model takes no images: only text content parts.",
                           param=f"messages[{i}].content[{j}].type")
        if part.type != "text" or part.text is None:
            raise APIError(400, f"Content parts of type `{part.type}` are not supported; only text.",
                           param=f"messages[{i}].content[{j}].type")
        texts.append(part.text)
    return "\n".join(texts)


def _tool_call(call, i: int, j: int) -> dict[str, Any]:
    if call.type != "function":
        raise APIError(400, f"Tool calls of type `{call.type}` are not supported; only `function`.",
                       param=f"messages[{i}].tool_calls[{j}].type")
    arguments = call.function.arguments
    if isinstance(arguments, str):
        # As vLLM: arguments that are not a JSON object become {} rather than a 400, since the
        # bad string lives in the conversation's history and would fail every later turn too.
        # Too deep is a 400 all the same: such a string was never a model's tool call.
        try:
            arguments = nesting.loads(arguments) if arguments.strip() else {}
        except nesting.TooDeep as exc:
            param = f"messages[{i}].tool_calls[{j}].function.arguments"
            raise APIError(400, f"`{param}` is not valid: {exc}.", param=param, code="invalid_value") from None
        except ValueError:
            arguments = {}
    if not isinstance(arguments, dict):
        arguments = {}
    return {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": arguments}}
