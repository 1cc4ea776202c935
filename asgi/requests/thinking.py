"""Thinking budgets and reasoning effort at the edge: how many tokens a request may think, as the engine's
ThinkingBudget (engine_proc/sample/thinking.py writes the reasoning parser's end marker once they are spent).

- `thinking_token_budget` (chat, vLLM's name): the budget; it needs --reasoning-parser, which says where the
  thinking ends (else a 400 naming it).
- `reasoning_effort` (chat; the Responses API's `reasoning.effort`): the chat template gets it as a variable
  (GPT-OSS's reads it), `none` also turns `enable_thinking` off (Qwen3's switch); with a reasoning parser
  it is a budget too (EFFORT_BUDGETS), unless `thinking_token_budget` says otherwise.
- Anthropic's `thinking.budget_tokens` (Messages): the budget where the server has a reasoning parser;
  without one it is checked but not enforced, as before.
"""
from __future__ import annotations

from typing import Any

from rill.asgi.errors import APIError
from rill.asgi.parsers.reasoning import CLOSE, OPEN, OPENING_OPTIONAL
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


def chat_thinking(state, req) -> ThinkingBudget | None:
    """A chat request's budget: its thinking_token_budget, else its reasoning_effort's (with a reasoning parser)."""
    if req.thinking_token_budget is not None:
        return thinking_budget(state, req.thinking_token_budget, param="thinking_token_budget")
    budget = EFFORT_BUDGETS.get(effort_of(req.reasoning_effort)) if req.reasoning_effort else None
    return thinking_budget(state, budget) if budget is not None else None


def thinking_budget(state, max_tokens: int | None, param: str | None = None) -> ThinkingBudget | None:
    """The engine's budget of `max_tokens` thinking tokens, the markers tokenized for the served model. Without
    a reasoning parser: a 400 naming `param` where a client asked by name, else no budget."""
    parser = state.settings.http.reasoning_parser
    if max_tokens is None or parser not in OPENING_OPTIONAL:
        if max_tokens is not None and param is not None:
            raise APIError(400, f"`{param}` needs the server started with a <think> --reasoning-parser (qwen3, "
                                "deepseek_r1), which says where the thinking ends.", param=param, code="invalid_value")
        return None
    encode = state.tokenizer.encode
    opening = [] if OPENING_OPTIONAL[parser] else encode(OPEN, add_special_tokens=False).ids
    return ThinkingBudget(max_tokens, encode(CLOSE, add_special_tokens=False).ids, opening)
