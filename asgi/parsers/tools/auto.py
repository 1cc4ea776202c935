"""`--tool-call-parser auto`: the parser whose format the chat template itself writes.

A template renders the model's past tool calls back into its prompt, so the markers it uses are the ones
the model was trained to write. Tried in order, most specific first: Qwen3-Coder's XML calls also sit
inside `<tool_call>` (hermes'), Granite 3.1's JSON list too. A request's own `chat_template` (with
--trust-request-chat-template) picks for that request.
"""
from __future__ import annotations

import functools

# (parser, markers that must all be in the template)
FORMATS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("openai", ("<|channel|>", "<|call|>")),  # GPT-OSS's harmony
    ("minimax_m2", ("<minimax:tool_call>", "<invoke name=")),
    ("seed_oss", ("<seed:tool_call>", "<function=")),
    ("qwen3_coder", ("<tool_call>", "<function=")),
    ("glm45", ("<tool_call>", "<arg_key>", "<arg_value>")),  # GLM-4.5 to 4.7: keys and values inside <tool_call>
    ("kimi_k2", ("<|tool_calls_section_begin|>", "<|tool_call_begin|>")),
    ("gemma4", ("<|tool_call>", "<tool_call|>")),  # Gemma 4: call:NAME{...} between its own markers
    ("deepseek_v3", ("<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "```json")),  # type, sep, name, a fenced block
    ("deepseek_v31", ("<｜tool▁call▁begin｜>", "<｜tool▁sep｜>")),  # name, sep, the arguments as written
    ("mistral", ("[TOOL_CALLS]",)),
    ("granite", ("<|tool_call|>",)),  # Granite 3.0
    ("granite", ("<|start_of_role|>", "<tool_call>")),  # Granite 3.1+: a JSON list after <tool_call>
    ("hunyuan_a13b", ("<tool_calls>", "</tool_calls>")),  # Hunyuan-A13B: a JSON array in <tool_calls>
    ("hermes", ("<tool_call>",)),
    ("olmo3", ("<function_calls>", "</function_calls>")),  # OLMo 3: pythonic calls, one a line, in these tags
    ("pythonic", ("[func_name1(",)),  # vLLM's pythonic templates (Llama 3.2, Llama 4) spell the form out
    ("llama3_json", ("<|python_tag|>",)),
    ("llama3_json", ('"parameters": dictionary of argument name and its value',)),  # Llama 3.2's own template
)


@functools.lru_cache(maxsize=16)
def pick_tool_parser(template_source: str) -> str | None:
    """The parser for the format `template_source` writes tool calls in; None when it shows none known."""
    for name, markers in FORMATS:
        if all(marker in template_source for marker in markers):
            return name
    return None
