"""Reasoning parsers (vLLM's `--reasoning-parser` names): `<think>...</think>` becomes `reasoning_content`."""
from __future__ import annotations

from rill.asgi.parsers.chat_output import BufferedParser
from rill.asgi.parsers.tools.deltas import DeltaBuilder, held_tail
from rill.asgi.parsers.tools.harmony import HarmonyParser

OPEN, CLOSE = "<think>", "</think>"


class ThinkParser(BufferedParser):
    """Text up to `</think>` is reasoning, the rest content. An opening `<think>` is recognised
    only at the start of the output (leading whitespace dropped with it).

    opening_optional (deepseek_r1): without the opening tag the output still starts in reasoning
    (R1's template writes `<think>` into the prompt); with no `</think>` at all it is all
    reasoning, as in vLLM (an answer cut short while thinking). Else (qwen3): without the
    opening tag it is all content (Qwen3 with thinking off).
    """

    called_tools = False

    def __init__(self, opening_optional: bool):
        self.opening_optional = opening_optional
        self.state = "start"  # start, reasoning, content
        self.pending = ""

    def _drain(self, final: bool) -> dict:
        delta = DeltaBuilder()
        if self.state == "start":
            head = self.pending.lstrip()
            if head.startswith(OPEN):
                self.pending, self.state = head[len(OPEN):], "reasoning"
            elif not final and OPEN.startswith(head):
                return {}
            else:
                self.state = "reasoning" if self.opening_optional else "content"
        if self.state == "reasoning":
            at = self.pending.find(CLOSE)
            if at < 0:
                end = len(self.pending) - (0 if final else held_tail(self.pending, (CLOSE,)))
                delta.add_reasoning(self.pending[:end])
                self.pending = self.pending[end:]
                return delta.build()
            delta.add_reasoning(self.pending[:at])
            self.pending, self.state = self.pending[at + len(CLOSE):], "content"
        delta.add_content(self.pending)
        self.pending = ""
        return delta.build()


# The <think> parsers: whether each one's output may start in its reasoning without the opening tag (the
# grammar's think-then-constrain and the thinking budgets need it too: asgi/requests/structural_tags.py, thinking.py).
OPENING_OPTIONAL = {"deepseek_r1": True, "qwen3": False}
REASONING_PARSERS = {name: (lambda optional=optional: ThinkParser(opening_optional=optional))
                     for name, optional in OPENING_OPTIONAL.items()}
REASONING_PARSERS["openai_gptoss"] = HarmonyParser  # GPT-OSS's analysis channel (asgi/parsers/tools/harmony.py)
