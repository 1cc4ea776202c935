"""Each tool-call format a parser reads: a ChatML chat template that writes past calls the family's way (what
--tool-call-parser auto reads), and an output in that format with the calls it holds. The outputs call
get_weather(city) and get_time() (tests/e2e/test_tools.py's CITY_TOOL and TIME_TOOL)."""
from __future__ import annotations

# How each family's template writes an assistant message's call `tc` (its arguments a mapping).
CALL_RENDERINGS = {
    "hermes": '<tool_call>\n{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}\n'
              "</tool_call>",
    "qwen3_coder": "<tool_call>\n<function={{ tc.function.name }}>\n{% for k, v in tc.function.arguments | items %}"
                   "<parameter={{ k }}>\n{{ v }}\n</parameter>\n{% endfor %}</function>\n</tool_call>",
    "glm45": "<tool_call>{{ tc.function.name }}\n{% for k, v in tc.function.arguments | items %}<arg_key>{{ k }}"
             "</arg_key>\n<arg_value>{{ v }}</arg_value>\n{% endfor %}</tool_call>",
    "gemma4": "<|tool_call>call:{{ tc.function.name }}{{ '{' }}{% for k, v in tc.function.arguments | items %}{{ k }}:"
              '<|"|>{{ v }}<|"|>{% if not loop.last %},{% endif %}{% endfor %}{{ \'}\' }}<tool_call|>',
    "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>{{ tc.id }}<|tool_call_argument_begin|>"
               "{{ tc.function.arguments | tojson }}<|tool_call_end|><|tool_calls_section_end|>",
    "minimax_m2": '<minimax:tool_call>\n<invoke name="{{ tc.function.name }}">\n{% for k, v in tc.function.arguments '
                  '| items %}<parameter name="{{ k }}">{{ v }}</parameter>\n{% endfor %}</invoke>\n</minimax:tool_call>',
    "seed_oss": "<seed:tool_call>\n<function={{ tc.function.name }}>\n{% for k, v in tc.function.arguments | items %}"
                "<parameter={{ k }}>{{ v }}</parameter>\n{% endfor %}</function>\n</seed:tool_call>",
    "hunyuan_a13b": '<tool_calls>[{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}]'
                    "</tool_calls>",
    "mistral": "[TOOL_CALLS]{{ tc.function.name }}[ARGS]{{ tc.function.arguments | tojson }}",
    "deepseek_v3": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>{{ tc.function.name }}\n"
                   "```json\n{{ tc.function.arguments | tojson }}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "deepseek_v31": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{{ tc.function.name }}<｜tool▁sep｜>"
                    "{{ tc.function.arguments | tojson }}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "granite": '<|tool_call|>[{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}]',
    "pythonic": "[{{ tc.function.name }}({% for k, v in tc.function.arguments | items %}{{ k }}={{ v | tojson }}"
                "{% endfor %})]",
    "olmo3": "<function_calls>\n{{ tc.function.name }}({% for k, v in tc.function.arguments | items %}{{ k }}="
             "{{ v | tojson }}{% endfor %})\n</function_calls>",
    "llama3_json": '<|python_tag|>{"name": "{{ tc.function.name }}", "parameters": '
                   "{{ tc.function.arguments | tojson }}}",
    "openai": "<|start|>assistant to=functions.{{ tc.function.name }}<|channel|>commentary json<|message|>"
              "{{ tc.function.arguments | tojson }}<|call|>",
}
# What the pythonic templates tell the model (vLLM's examples/tool_chat_template_llama3.2_pythonic.jinja).
PYTHONIC_INSTRUCTIONS = ("If you decide to invoke any of the function(s), you MUST put it in the format of "
                         "[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]")


def chat_template(fmt: str) -> str:
    """A ChatML template whose assistant tool calls are written in `fmt`'s format."""
    instructions = PYTHONIC_INSTRUCTIONS + "\n" if fmt == "pythonic" else ""
    return (
        "{%- if tools %}<|im_start|>system\n" + instructions + "{%- for tool in tools %}{{ tool | tojson }}\n"
        "{%- endfor %}<|im_end|>\n{% endif %}"
        "{%- for m in messages %}"
        "{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n{{ m.content or '' }}"
        "{%- for tc in m.tool_calls %}" + CALL_RENDERINGS[fmt] + "{% endfor %}<|im_end|>\n"
        "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


PARIS, NONE = ("get_weather", {"city": "Paris"}), ("get_time", {})
DS_CALL = "<｜tool▁call▁begin｜>{}<｜tool▁call▁end｜>"
# format -> (the model's output, its content, its calls as (name, arguments))
OUTPUTS = {
    "hermes": ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', "Let me check.\n", [PARIS, NONE]),
    "qwen3_coder": ("Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                    "</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>",
                    "Let me check.\n", [PARIS, NONE]),
    "glm45": ("Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
              "</tool_call>\n<tool_call>get_time\n</tool_call>", "Let me check.\n", [PARIS, NONE]),
    "gemma4": ('Let me check.<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|><|tool_call>call:get_time{}'
               "<tool_call|>", "Let me check.", [PARIS, NONE]),
    "kimi_k2": ("Let me check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_call_begin|>functions.get_time:1'
                "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>", "Let me check.", [PARIS, NONE]),
    "minimax_m2": ('Let me check.\n<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris'
                   '</parameter>\n</invoke>\n<invoke name="get_time">\n</invoke>\n</minimax:tool_call>',
                   "Let me check.\n", [PARIS, NONE]),
    "seed_oss": ("Let me check.\n<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n"
                 "</function>\n</seed:tool_call>\n<seed:tool_call>\n<function=get_time>\n</function>\n"
                 "</seed:tool_call>", "Let me check.\n", [PARIS, NONE]),
    "hunyuan_a13b": ('Let me check.<tool_calls>[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                     '{"name": "get_time", "arguments": {}}]</tool_calls>', "Let me check.", [PARIS, NONE]),
    "mistral": ('Let me check.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}',
                "Let me check.", [PARIS, NONE]),
    "deepseek_v3": ("Let me check.<｜tool▁calls▁begin｜>"
                    + DS_CALL.format('function<｜tool▁sep｜>get_weather\n```json\n{"city": "Paris"}\n```')
                    + DS_CALL.format("function<｜tool▁sep｜>get_time\n```json\n{}\n```") + "<｜tool▁calls▁end｜>",
                    "Let me check.", [PARIS, NONE]),
    "deepseek_v31": ("Let me check.<｜tool▁calls▁begin｜>" + DS_CALL.format('get_weather<｜tool▁sep｜>{"city": "Paris"}')
                     + DS_CALL.format("get_time<｜tool▁sep｜>{}") + "<｜tool▁calls▁end｜>", "Let me check.", [PARIS, NONE]),
    "granite": ('<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                '{"name": "get_time", "arguments": {}}]', None, [PARIS, NONE]),
    "pythonic": ('[get_weather(city="Paris"), get_time()]', None, [PARIS, NONE]),
    "olmo3": ('<function_calls>\nget_weather(city="Paris")\nget_time()\n</function_calls>', None, [PARIS, NONE]),
    "llama3_json": ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
                    '{"name": "get_time", "parameters": {}}', None, [PARIS, NONE]),
    "openai": ("<|channel|>analysis<|message|>Two calls.<|end|><|start|>assistant<|channel|>commentary "
               'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|><|start|>assistant'
               "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|><|call|>", None, [PARIS, NONE]),
}


def literal_regex(text: str) -> str:
    """A regex matching exactly `text` (the grammar's syntax: only its metacharacters escaped)."""
    return "".join("\\" + c if c in "\\^$.|?*+()[]{}" else ("\\n" if c == "\n" else c) for c in text)
