"""The Responses API's `truncation: "auto"`: a conversation longer than the context loses its oldest items.

As OpenAI's: items are dropped from the beginning of the conversation (the chain of `previous_response_id`, a
`conversation`, then the input) until the prompt fits; the `instructions` stay. A call's results go with the turn
that made the call: a `tool` message left at the front is dropped too, so no template sees an answer to no call.
The fewest items are dropped, found by halving (a few renders, not one per item).
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

Prompt = tuple[list[int], Any]


def cut_at(messages: list[dict[str, Any]], num: int) -> list[dict[str, Any]]:
    """`messages` without their first `num`, and without the `tool` answers that would then open them."""
    rest = messages[num:]
    while rest and rest[0].get("role") == "tool":
        rest = rest[1:]
    return rest


async def fitting(messages: list[dict[str, Any]], render: Callable[[list[dict[str, Any]]], Awaitable[Prompt]],
                  fits: Callable[[list[int]], bool]) -> tuple[list[dict[str, Any]], Prompt]:
    """(the messages kept, their prompt): all of them where they fit, else the fewest dropped from the front that
    fit; where only the last would be left and it does not fit either, all of them (the caller's 400 follows)."""
    prompt = await render(messages)
    if fits(prompt[0]) or len(messages) < 2:
        return messages, prompt
    low, high = 1, len(messages) - 1  # drop at least one, keep at least the last
    best: tuple[list[dict[str, Any]], Prompt] | None = None
    while low <= high:
        num = (low + high) // 2
        kept = cut_at(messages, num)
        candidate = await render(kept) if kept else None
        if candidate is not None and fits(candidate[0]):
            best, high = (kept, candidate), num - 1
        else:
            low = num + 1
    return best if best is not None else (messages, prompt)
