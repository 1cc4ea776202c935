"""Reasoning parsers (vLLM's `--reasoning-parser` names): `<think>...</think>` (or a format's own tags) becomes
`reasoning_content`."""
from __future__ import annotations

from dataclasses import dataclass

from rill.asgi.parsers.chat_output import BufferedParser
from rill.asgi.parsers.tools.deltas import DeltaBuilder, held_tail
from rill.asgi.parsers.tools.harmony import HarmonyParser


@dataclass(frozen=True)
class ThinkFormat:
    """A thinking model's tags. `opening_optional`: the output starts in its thinking without the opening tag (the
    template writes it into the prompt, or the model never writes it); else an output without it is all content
    (thinking switched off). `reads_special_tokens`: the tags are special tokens, which the text must keep."""

    open: str
    close: str
    opening_optional: bool
    reads_special_tokens: bool = False
    answer_opens: str = ""  # also ends the thinking, without `close`, and begins the content (Kimi's tool calls)
    # The chat_template_kwargs key that switches the template's thinking on or off, and its default: switched off,
    # the output is all content (a format whose thinking opens in the prompt would otherwise read it all as thinking)
    switch: str = ""
    on_by_default: bool = True
    alt_open: tuple[str, ...] = ()  # other spellings of `open` and `close` (Granite's "Here's")
    alt_close: tuple[str, ...] = ()
    # Tags around the answer, dropped with the newlines before the opening one: ERNIE 4.5's `<response>`, Hunyuan's
    # `</answer>` (whose `<answer>` closes the thinking). The closing tag ends the answer: what follows is dropped.
    answer_open: str = ""
    answer_close: str = ""

    @property
    def opens(self) -> tuple[str, ...]:
        return (self.open, *self.alt_open)

    @property
    def closes(self) -> tuple[str, ...]:
        return (self.close, *self.alt_close)


R1 = ThinkFormat("<think>", "</think>", opening_optional=True)
QWEN3 = ThinkFormat("<think>", "</think>", opening_optional=False)
THINK_FORMATS = {
    "deepseek_r1": R1,
    "minimax_m2": R1,  # MiniMax-M2 never writes the opening tag
    "step3": R1,  # Step3 neither
    "qwen3": QWEN3,
    "glm45": QWEN3,  # GLM-4.5 and 4.6: `<think>` opens the answer; thinking off, the template closed it already
    "mimo": QWEN3,
    "seed_oss": ThinkFormat("<seed:think>", "</seed:think>", opening_optional=False),
    "mistral": ThinkFormat("[THINK]", "[/THINK]", opening_optional=False, reads_special_tokens=True),  # Magistral
    # Kimi K2 Thinking: its calls' section may follow the thinking with no `</think>` (the tags are special tokens)
    "kimi_k2": ThinkFormat("<think>", "</think>", opening_optional=True, reads_special_tokens=True,
                           answer_opens="<|tool_calls_section_begin|>", switch="thinking"),
    # Gemma 4 (`enable_thinking`): its thought channel, the label `thought` dropped; a call may end it too
    "gemma4": ThinkFormat("<|channel>thought\n", "<channel|>", opening_optional=False, reads_special_tokens=True,
                          answer_opens="<|tool_call>", alt_open=("<|channel>",)),
    # DeepSeek V3.1 and later: R1's thinking where the template is asked for it (`thinking: true`), else none
    "deepseek_v3": ThinkFormat("<think>", "</think>", opening_optional=True, switch="thinking", on_by_default=False),
    "olmo3": R1,  # OLMo 3 Think: its template opens the thinking
    "ernie45": ThinkFormat("<think>", "</think>", opening_optional=True, answer_open="<response>",
                           answer_close="</response>"),
    "hunyuan_a13b": ThinkFormat("<think>\n", "\n</think>\n<answer>\n", opening_optional=False, answer_close="\n</answer>"),
    # Granite 3.2 and 3.3 with `thinking: true` in chat_template_kwargs: plain-text markers, in two spellings
    "granite": ThinkFormat("Here is my thought process:", "Here is my response:", opening_optional=False,
                           alt_open=("Here's my thought process:",), alt_close=("Here's my response:",)),
}


def thinking_switched_off(name: str | None, template_kwargs: dict) -> bool:
    """Whether a request's chat_template_kwargs turn its format's thinking off (Kimi's and DeepSeek V3.1's
    `thinking`): its output is then read as content only, as vLLM reads it."""
    fmt = THINK_FORMATS.get(name or "")
    return fmt is not None and bool(fmt.switch) and not template_kwargs.get(fmt.switch, fmt.on_by_default)


class ThinkParser(BufferedParser):
    """Text up to the closing tag is reasoning, the rest content. An opening tag is recognised only at the start of
    the output (leading whitespace dropped with it).

    With `opening_optional` (deepseek_r1), without the opening tag the output still starts in reasoning (R1's
    template writes `<think>` into the prompt); with no closing tag at all it is all reasoning, as in vLLM (an
    answer cut short while thinking). Else (qwen3): without the opening tag it is all content (Qwen3 with
    thinking off).
    """

    called_tools = False

    def __init__(self, fmt: ThinkFormat = QWEN3):
        self.fmt = fmt
        self.state = "start"  # start, reasoning, answer (before its opening tag), content, done
        self.pending = ""

    def _drain(self, final: bool) -> dict:
        delta = DeltaBuilder()
        fmt = self.fmt
        if self.state == "start":
            head = self.pending.lstrip()
            if not final and any(tag.startswith(head) and tag != head for tag in fmt.opens):
                return {}  # nothing yet, or maybe an opening tag (the longest that fits: Gemma 4's with its label)
            opening = next((tag for tag in fmt.opens if head.startswith(tag)), None)
            if opening is not None:
                self.pending, self.state = head[len(opening):], "reasoning"
            else:
                self.state = "reasoning" if fmt.opening_optional else "answer"
        if self.state == "reasoning":
            ends = (*fmt.closes, fmt.answer_opens) if fmt.answer_opens else fmt.closes
            at, tag = min(((at, tag) for tag in ends if (at := self.pending.find(tag)) >= 0), default=(-1, None))
            if tag is None:
                end = len(self.pending) - (0 if final else held_tail(self.pending, ends))
                delta.add_reasoning(self.pending[:end])
                self.pending = self.pending[end:]
                return delta.build()
            delta.add_reasoning(self.pending[:at])
            self.pending, self.state = self.pending[at + (0 if tag == fmt.answer_opens else len(tag)):], "answer"
        if self.state == "answer":
            if fmt.answer_open:
                head = self.pending.lstrip("\n")
                if not final and (not head or fmt.answer_open.startswith(head) and head != fmt.answer_open):
                    return delta.build()
                self.pending = head[len(fmt.answer_open):] if head.startswith(fmt.answer_open) else head
            self.state = "content"
        if self.state == "content":
            self._content(delta, final)
        else:  # done: the answer's closing tag came
            self.pending = ""
        return delta.build()

    def _content(self, delta: DeltaBuilder, final: bool) -> None:
        close = self.fmt.answer_close
        if not close:
            delta.add_content(self.pending)
            self.pending = ""
            return
        at = self.pending.find(close)
        if at >= 0:
            delta.add_content(self.pending[:at])
            self.pending, self.state = "", "done"
            return
        end = len(self.pending) - (0 if final else held_tail(self.pending, (close,)))
        delta.add_content(self.pending[:end])
        self.pending = self.pending[end:]


class ThinkParsers:
    """Makes a format's ThinkParser; says whether its text keeps special tokens (asgi/parsers/chat_parsing.py)."""

    def __init__(self, fmt: ThinkFormat) -> None:
        self.fmt = fmt
        self.reads_special_tokens = fmt.reads_special_tokens

    def __call__(self) -> ThinkParser:
        return ThinkParser(self.fmt)


class PrependedThinking(BufferedParser):
    """vLLM's `minimax_m2_append_think`: no split; the content is the whole output after the `<think>` that
    MiniMax-M2's template wrote into the prompt, so that a client that reads thinking from the text finds it."""

    called_tools = False

    def __init__(self) -> None:
        self.pending, self.opened = "", False

    def _drain(self, final: bool) -> dict:
        delta = DeltaBuilder()
        delta.add_content(("" if self.opened else "<think>") + self.pending)
        self.pending, self.opened = "", True
        return delta.build()


# The grammar's think-then-constrain and the thinking budgets read the same formats (asgi/parsers/thinking_markers.py).
REASONING_PARSERS = {name: ThinkParsers(fmt) for name, fmt in THINK_FORMATS.items()}
REASONING_PARSERS["minimax_m2_append_think"] = PrependedThinking
REASONING_PARSERS["openai_gptoss"] = HarmonyParser  # GPT-OSS's analysis channel (asgi/parsers/tools/harmony.py)
