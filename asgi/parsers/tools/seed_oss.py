"""vLLM's `seed_oss` tool parser: Seed-OSS's XML calls,

    <seed:tool_call>
    <function=get_weather>
    <parameter=city>San Francisco</parameter>
    </function>
    </seed:tool_call>

read as qwen3_coder reads Qwen3-Coder's (qwen3_coder.py: values typed by the tools' schemas, streamed as they close,
a call cut off closed with what it has), inside Seed-OSS's own tags, which the text keeps where they are special
tokens (reads_special_tokens).
"""
from __future__ import annotations

from rill.asgi.parsers.tools.qwen3_coder import Qwen3CoderParser


class SeedOssParser(Qwen3CoderParser):
    reads_special_tokens = True
    open, close = "<seed:tool_call>", "</seed:tool_call>"
    call_tag = (open, f"{open}\n<function=NAME>\n", f"</function>\n{close}")
