"""Where a reasoning model's thinking opens and ends in its output, per format: what think-then-constrain
(asgi/requests/structural_tags.py) and the thinking budgets (asgi/requests/thinking.py) need of it.

- `<think>` models: qwen3 opens its thinking with `<think>`; deepseek_r1's template opens it in the prompt, so
  every output starts in its thinking. `</think>` ends it, and the answer follows.
- GPT-OSS's harmony (`--reasoning-parser openai_gptoss`, or the `openai` tool parser, which reads the reasoning
  too): the thinking is an analysis message; the model ends it with `<|end|>`, and the answer is the final
  message, `<|start|>assistant<|channel|>final<|message|>...`. Its markers are special tokens, which a grammar
  does not write: the grammar starts after `<|channel|>final<|message|>` instead (StructuredSpec.start_ids).
"""
from __future__ import annotations

from dataclasses import dataclass

from rill.asgi.parsers.reasoning import THINK_FORMATS


@dataclass(frozen=True)
class ThinkingMarkers:
    open: str  # opens the thinking in the output; "" where every output starts in its thinking
    close: str  # what the engine writes to end the thinking when its budget is spent; the answer follows
    closed_by: str  # what a model writes when it ends its thinking itself
    answer: str = ""  # harmony: where the answer, and its grammar, starts (a <think> model: right after `close`)


# With an `open`, an output that does not open with it does not think (qwen3 with thinking off).
THINK = {name: ThinkingMarkers("" if fmt.opening_optional else fmt.open, fmt.close, fmt.close)
         for name, fmt in THINK_FORMATS.items()}
HARMONY_PARSER = "openai"  # the tool parser that reads harmony, reasoning included
HARMONY = ThinkingMarkers("<|channel|>analysis<|message|>", "<|end|><|start|>assistant<|channel|>final<|message|>",
                          "<|end|>", answer="<|channel|>final<|message|>")


def thinking_markers(reasoning_parser: str | None, *, harmony_calls: bool = False) -> ThinkingMarkers | None:
    """The markers of a request's output: its reasoning parser's, or harmony's where the `openai` tool parser
    reads the output (`harmony_calls`); None where nothing splits the thinking off."""
    if harmony_calls or reasoning_parser == "openai_gptoss":
        return HARMONY
    return THINK.get(reasoning_parser)
