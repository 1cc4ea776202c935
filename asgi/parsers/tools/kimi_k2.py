"""vLLM's `kimi_k2` tool parser: Kimi K2's calls between its special markers, one section of them:

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>
    {"city": "Beijing"}<|tool_call_end|><|tool_calls_section_end|>

As deepseek_v31 reads DeepSeek's (deepseek_v3.py: content around the section, arguments as written, a call cut
off ends with what came), with Kimi's markers. The model writes each call's id, `functions.NAME:INDEX`: it is the
call's `id` (Kimi's chat template writes it back into the next turn's prompt, as vLLM keeps it), and NAME its
function (a bare NAME gets an OpenAI-style id). The markers are special tokens: the text keeps them
(reads_special_tokens), as vLLM's does.
"""
from __future__ import annotations

from rill.asgi.parsers.tools.deepseek_v3 import DeepSeekV31Parser

SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, CALL_END, ARGS = "<|tool_call_begin|>", "<|tool_call_end|>", "<|tool_call_argument_begin|>"


class KimiK2Parser(DeepSeekV31Parser):
    reads_special_tokens = True
    calls_begin, calls_end, call_begin, call_end, sep = SECTION_BEGIN, SECTION_END, CALL_BEGIN, CALL_END, ARGS
    # A strict call (requests/strict_calls.py): its id `functions.NAME:INDEX`, the index the model's own (Kimi's
    # template counts calls over the conversation), then its arguments.
    call_tag = (CALL_BEGIN, f"{CALL_BEGIN}functions.NAME:", CALL_END)
    call_index = ARGS

    def _named(self, name: str) -> tuple[str, str]:
        """`functions.get_weather:0` is the call's id; its function is `get_weather`. A bare name gets an id."""
        function = name.rpartition(":")[0].rpartition(".")[2]
        return (name, function) if function else (self.make_id(), name)
