"""A thinking, tool-calling model's output in Qwen3's and Hermes' formats, for the tests of the answers built from
chat's output parsers (Anthropic's Message blocks, Ollama's answer)."""
from __future__ import annotations

import json

TOOLS = [{"type": "function", "function": {"name": "get_weather"}}, {"type": "function", "function": {"name": "get_time"}}]
WEATHER = {"city": "Paris", "units": ["C", {"nested": "}]\"{"}]}
OUTPUT = ("<think>Which city? Paris.</think>Let me check.\n<tool_call>\n"
          + json.dumps({"name": "get_weather", "arguments": WEATHER})
          + "\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>")
