"""vLLM's `minimax_m2` tool parser: MiniMax-M2's XML calls,

    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">San Francisco</parameter>
    </invoke>
    </minimax:tool_call>

read as qwen3_coder reads Qwen3-Coder's (qwen3_coder.py: values typed by the tools' schemas, streamed as they
close, a call cut off closed with what it has), with MiniMax's tags: names and keys lose their quotes, values the
whitespace around them (as vLLM's). The tags are special tokens: the text keeps them (reads_special_tokens).
"""
from __future__ import annotations

from rill.asgi.parsers.tools.qwen3_coder import Qwen3CoderParser


class MiniMaxM2Parser(Qwen3CoderParser):
    reads_special_tokens = True
    open, close = "<minimax:tool_call>", "</minimax:tool_call>"
    function, function_end, parameter, parameter_end = "<invoke name=", "</invoke>", "<parameter name=", "</parameter>"
    # A strict call: each <invoke> in xgrammar's "minimax_xml" style, one or more in a <minimax:tool_call> block
    call_tag = (open, '<invoke name="NAME">\n', "</invoke>\n")
    call_block = (f"{open}\n", close)
    call_style = "minimax_xml"

    @staticmethod
    def _unquoted(name: str) -> str:
        name = name.strip()
        return name[1:-1].strip() if len(name) >= 2 and name[0] == name[-1] and name[0] in "\"'" else name

    @staticmethod
    def _value(text: str) -> str:
        return text.strip()
