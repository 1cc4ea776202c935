"""Tool-call parsers by vLLM's `--tool-call-parser` names; each is an OutputParser (asgi/parsers/chat_output.py)."""
from __future__ import annotations

from rill.asgi.parsers.tools.deepseek_v3 import DeepSeekV3Parser, DeepSeekV31Parser
from rill.asgi.parsers.tools.gemma4 import Gemma4Parser
from rill.asgi.parsers.tools.glm45 import Glm45Parser
from rill.asgi.parsers.tools.granite import GraniteParser, Phi4MiniJsonParser
from rill.asgi.parsers.tools.harmony import HarmonyParser
from rill.asgi.parsers.tools.hermes import HermesParser
from rill.asgi.parsers.tools.hunyuan import HunyuanParser
from rill.asgi.parsers.tools.kimi_k2 import KimiK2Parser
from rill.asgi.parsers.tools.llama3_json import Llama3JsonParser
from rill.asgi.parsers.tools.minimax_m2 import MiniMaxM2Parser
from rill.asgi.parsers.tools.mistral import MistralParser
from rill.asgi.parsers.tools.olmo3 import Olmo3Parser
from rill.asgi.parsers.tools.pythonic import PythonicParser
from rill.asgi.parsers.tools.qwen3_coder import Qwen3CoderParser
from rill.asgi.parsers.tools.seed_oss import SeedOssParser

TOOL_PARSERS = {
    "deepseek_v3": DeepSeekV3Parser,
    "deepseek_v31": DeepSeekV31Parser,
    "ernie45": HermesParser,  # ERNIE 4.5: hermes' JSON calls in <tool_call>
    "gemma4": Gemma4Parser,
    "glm45": Glm45Parser,
    "glm47": Glm45Parser,
    "granite": GraniteParser,
    "hermes": HermesParser,
    "hunyuan_a13b": HunyuanParser,
    "kimi_k2": KimiK2Parser,
    "llama3_json": Llama3JsonParser,
    "minimax_m2": MiniMaxM2Parser,
    "mistral": MistralParser,
    "olmo3": Olmo3Parser,
    "openai": HarmonyParser,
    "phi4_mini_json": Phi4MiniJsonParser,
    "pythonic": PythonicParser,
    "qwen3_coder": Qwen3CoderParser,
    "seed_oss": SeedOssParser,
}
