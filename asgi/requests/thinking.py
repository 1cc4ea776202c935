"""Thinking budgets and reasoning effort at the edge: how many tokens a request may think, as the engine's
ThinkingBudget (engine_proc/sample/thinking.py writes the reasoning parser's end marker once they are spent).

- `thinking_token_budget` (chat, vLLM's name): the budget; it needs a reasoning parser, which says where the
  thinking ends (else a 400 naming it): --reasoning-parser, or the `openai` tool parser (harmony) on a request
  with tools. The markers of each format: asgi/parsers/thinking_markers.py.
- `reasoning_effort` (chat; the Responses API's `reasoning.effort`): the chat template gets it as a variable
  (GPT-OSS's reads it), `none` also turns `enable_thinking` off (Qwen3's switch); with a reasoning parser
  it is a budget too (EFFORT_BUDGETS), unless `thinking_token_budget` says otherwise. The Responses API's answer
  says the effort it honoured (honoured_effort), null where it changed nothing.
- Anthropic's `thinking.budget_tokens` (Messages): the budget where the server has a reasoning parser;
  without one it is checked but not enforced, as before.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rill.asgi.errors import APIError
from rill.asgi.parsers.thinking_markers import ThinkingMarkers
from rill.ipc.protocol import ThinkingBudget

# OpenAI's efforts (its ReasoningEffort) as budgets in tokens; None: no budget.
EFFORT_BUDGETS: dict[str, int | None] = {"none": 0, "minimal": 256, "low": 1024, "medium": 4096, "high": 16384,
                                         "xhigh": None, "max": None}


def effort_of(effort: str | None, param: str = "reasoning_effort") -> str | None:
    """The effort, checked: one of OpenAI's values, else a 400 naming `param`."""
    if effort is not None and effort not in EFFORT_BUDGETS:
        raise APIError(400, f"`{param}` must be one of {', '.join(EFFORT_BUDGETS)}; got {str(effort)[:50]!r}.",
                       param=param, code="invalid_value")
    return effort


def effort_template_kwargs(effort: str | None) -> dict[str, Any]:
    """What the chat template gets of an effort: the effort itself, and with `none` thinking switched off."""
    if effort is None:
        return {}
    return {"reasoning_effort": effort, **({"enable_thinking": False} if effort == "none" else {})}


def honoured_effort(effort: str | None, markers: ThinkingMarkers | None, template_source: str) -> str | None:
    """The effort a request's generation honours, as the response says it: the request's where the output's
    thinking is split off (a budget, or none for xhigh and max) or the chat template reads it (GPT-OSS's
    `reasoning_effort`, Qwen3's `enable_thinking` for none); None where it changes nothing."""
    if effort is None:
        return None
    if markers is not None or "reasoning_effort" in template_source or \
            (effort == "none" and "enable_thinking" in template_source):
        return effort
    return None


def requested_tokens(req) -> int | None:
    """A chat request's budget in tokens: its thinking_token_budget, else its reasoning_effort's; None: none."""
    if req.thinking_token_budget is not None:
        return req.thinking_token_budget
    return EFFORT_BUDGETS.get(effort_of(req.reasoning_effort)) if req.reasoning_effort else None


def thinking_budget(max_tokens: int | None, markers: ThinkingMarkers | None, encode: Callable[[str], list[int]],
                    param: str | None = None) -> ThinkingBudget | None:
    """The engine's budget of `max_tokens` thinking tokens, the markers tokenized for the served model. Where the
    output does not think (no markers): a 400 naming `param` where a client asked by name, else no budget."""
    if max_tokens is None or markers is None:
        if max_tokens is not None and param is not None:
            raise APIError(400, f"`{param}` needs the server started with a --reasoning-parser (qwen3, deepseek_r1, "
                                "openai_gptoss, ...), which says where the thinking ends.", param=param,
                           code="invalid_value")
        return None
    return ThinkingBudget(max_tokens, encode(markers.close), encode(markers.open) if markers.open else [],
                          encode(markers.closed_by) if markers.closed_by != markers.close else [])
