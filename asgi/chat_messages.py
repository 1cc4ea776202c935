"""Chat messages of a request -> the prompt's token ids, through the chat template."""
from __future__ import annotations

from asgi.errors import APIError
from asgi.schemas import ChatCompletionRequest
from asgi.state import WorkerState
from asgi.templating import TemplateError


def render_messages(state: WorkerState, req: ChatCompletionRequest) -> list[int]:
    messages = []
    for i, m in enumerate(req.messages):
        content = m.content
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if part.type != "text" or part.text is None:
                    raise APIError(400, f"Content parts of type `{part.type}` are not supported; only text.",
                                   param=f"messages[{i}].content[{j}].type")
                parts.append(part.text)
            content = "".join(parts)
        message = {"role": m.role, "content": content}
        if m.name is not None:
            message["name"] = m.name
        messages.append(message)
    extra = req.chat_template_kwargs or {}
    if reserved := {"messages", "add_generation_prompt"} & extra.keys():
        raise APIError(400, f"`chat_template_kwargs` must not set {sorted(reserved)}; use the request fields.",
                       param="chat_template_kwargs")
    try:
        text = state.template.render(messages, add_generation_prompt=req.add_generation_prompt, **extra)
    except TemplateError as exc:
        raise APIError(400, f"The chat template could not render these messages: {exc}", param="messages") from None
    return state.tokenizer.encode(text, add_special_tokens=False).ids
