"""Tool-call parsers by vLLM's `--tool-call-parser` names; each is an OutputParser (asgi/chat_output.py)."""
from __future__ import annotations

from asgi.tool_parsers.hermes import HermesParser
from asgi.tool_parsers.llama3_json import Llama3JsonParser

TOOL_PARSERS = {
    "hermes": HermesParser,
    "llama3_json": Llama3JsonParser,
}
