"""Which OutputParser each choice of a chat request gets: reasoning first, then tool calls."""
from __future__ import annotations

from collections.abc import Callable

from rill.asgi.output.chat_delta import merge_delta
from rill.asgi.parsers.chat_output import OutputParser, PlainText
from rill.asgi.parsers.reasoning import REASONING_PARSERS
from rill.asgi.parsers.tools import TOOL_PARSERS
from rill.asgi.parsers.tools.forced import NamedCall, RequiredCalls
from rill.asgi.requests.tool_choice import ToolMode, ToolPlan


class ReasoningThenTools:
    """The reasoning parser splits off `reasoning_content`; its content goes on to the tool parser."""

    def __init__(self, reasoning: OutputParser, tools: OutputParser):
        self.reasoning = reasoning
        self.tools = tools

    @property
    def called_tools(self) -> bool:
        return self.tools.called_tools

    def push(self, text: str) -> dict:
        return self._on(self.reasoning.push(text))

    def finish(self) -> dict:
        return merge_delta(self._on(self.reasoning.finish()), self.tools.finish())

    def _on(self, delta: dict) -> dict:
        content = delta.pop("content", "")
        return merge_delta(delta, self.tools.push(content)) if content else delta


class FirstCalls:
    """parallel_tool_calls false (chat, Responses) or disable_parallel_tool_use (Messages) with
    tool_choice auto: the grammar does not stop a model from writing a second call, so the calls
    past the first `max_calls` are left out; the text around them stays content."""

    def __init__(self, parser: OutputParser, max_calls: int):
        self.parser = parser
        self.max_calls = max_calls

    @property
    def called_tools(self) -> bool:
        return self.parser.called_tools

    def push(self, text: str) -> dict:
        return self._keep(self.parser.push(text))

    def finish(self) -> dict:
        return self._keep(self.parser.finish())

    def _keep(self, delta: dict) -> dict:
        if calls := delta.get("tool_calls"):
            kept = [call for call in calls if call["index"] < self.max_calls]
            if kept:
                delta["tool_calls"] = kept
            else:
                del delta["tool_calls"]
        return delta


def parser_factory(plan: ToolPlan, *, tool_parser: str | None,
                   reasoning_parser: str | None) -> Callable[[], OutputParser]:
    """A new parser per choice: the reasoning parser's, then the tool parser's on what follows the thinking
    (a call written while thinking is not a call). A forced call (named or required) is the whole output, so
    it skips the reasoning parser: its grammar applies from the first token (Anthropic's API allows no
    thinking with a forced tool either)."""
    if plan.mode is ToolMode.NAMED:
        return lambda: NamedCall(plan.function_name)
    if plan.mode is ToolMode.REQUIRED:
        return RequiredCalls
    make_reasoning = REASONING_PARSERS[reasoning_parser] if reasoning_parser else None
    make_tools = None
    if plan.mode is ToolMode.AUTO:
        parser_class, tools = TOOL_PARSERS[tool_parser], plan.tools
        make_tools = lambda: parser_class(tools=tools)  # noqa: E731 (qwen3_coder types its values by their schemas)
    if make_tools and plan.max_calls is not None:
        make_all_calls, max_calls = make_tools, plan.max_calls
        make_tools = lambda: FirstCalls(make_all_calls(), max_calls)  # noqa: E731
    # harmony (openai) splits off the reasoning itself: its parser alone
    if make_tools and make_reasoning and not getattr(TOOL_PARSERS[tool_parser], "handles_reasoning", False):
        return lambda: ReasoningThenTools(make_reasoning(), make_tools())
    return make_tools or make_reasoning or PlainText


def keeps_special_tokens(plan: ToolPlan, tool_parser: str | None, reasoning_parser: str | None = None) -> bool:
    """Whether the text must keep special tokens for the parsers: Mistral's `[TOOL_CALLS]`, Granite's
    `<|tool_call|>` and harmony's channels are special tokens, which a detokenizer that skips them would leave
    out (vLLM's parsers turn skip_special_tokens off the same way)."""
    if plan.mode is ToolMode.AUTO and getattr(TOOL_PARSERS[tool_parser], "reads_special_tokens", False):
        return True
    forced = plan.mode in (ToolMode.NAMED, ToolMode.REQUIRED)  # the call's JSON is the whole output
    return not forced and getattr(REASONING_PARSERS.get(reasoning_parser), "reads_special_tokens", False)
