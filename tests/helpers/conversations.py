"""Chat conversations and a tool-calling chat template the prompt and tool tests share."""
from __future__ import annotations

import json
from types import SimpleNamespace

from rill.asgi.prompt.chat_messages import render_prompt
from rill.asgi.prompt.templating import ChatTemplate
from rill.asgi.requests.schemas import chat_decoder
from rill.ipc.config import HttpConfig

TOOL_TEMPLATE = """{%- if tools %}<|im_start|>system
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools><|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
{{ m.content }}{% for tc in m.tool_calls %}<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
{%- for k, v in tc.function.arguments | items %} [{{ k }}={{ v }}]{% endfor %}
</tool_call>{% endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>user
<tool_response id="{{ m.tool_call_id }}">{{ m.content }}</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""



TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}},
         {"type": "function", "function": {"name": "get_time"}}]



CONVERSATION = [
    {"role": "developer", "content": "Use tools."},
    {"role": "user", "content": [{"type": "text", "text": "Weather"}, {"type": "text", "text": "in Paris?"}]},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "22 C"},
]


def state_with(template: ChatTemplate, trust: bool = False):
    return SimpleNamespace(template=template, vision=None,
                           settings=SimpleNamespace(http=HttpConfig(trust_request_chat_template=trust)))



def request(**fields):
    return chat_decoder.decode(json.dumps({"model": "m", **fields}).encode())



def render(state, **fields) -> str:
    return render_prompt(state, request(**fields))
