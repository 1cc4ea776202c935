"""Tool-call parsers by vLLM's `--tool-call-parser` names; each is an OutputParser (asgi/parsers/chat_output.py)."""
from __future__ import annotations

from rill.asgi.parsers.tools.hermes import HermesParser
from rill.asgi.parsers.tools.llama3_json import Llama3JsonParser

TOOL_PARSERS = {
    "hermes": HermesParser,
    "llama3_json": Llama3JsonParser,
}
