"""The Responses API's truncation "auto" (asgi/prompt/oldest_dropped.py): the fewest oldest messages dropped to fit,
a call's answers with the turn before them, the last message always kept; found in a few renders."""
from __future__ import annotations

import asyncio

from rill.asgi.prompt.oldest_dropped import cut_at, fitting


def render_counting(calls: list[int]):
    async def render(messages):
        calls.append(len(messages))
        return [0] * sum(m["size"] for m in messages), None
    return render


def messages(*sizes, roles=None):
    return [{"role": (roles or {}).get(i, "user"), "size": size} for i, size in enumerate(sizes)]


def test_the_fewest_oldest_messages_go():
    calls: list[int] = []
    kept, (ids, _) = asyncio.run(fitting(messages(*[10] * 100), render_counting(calls), lambda ids: len(ids) <= 255))
    assert len(kept) == 25 and len(ids) == 250
    assert len(calls) <= 9  # halving: not one render per message


def test_everything_fits_or_nothing_can():
    msgs = messages(5, 5, 5)
    assert asyncio.run(fitting(msgs, render_counting([]), lambda ids: len(ids) <= 15))[0] == msgs
    huge = messages(5, 500)
    assert asyncio.run(fitting(huge, render_counting([]), lambda ids: len(ids) <= 100))[0] == huge  # the 400 follows


def test_a_calls_answers_go_with_it():
    msgs = messages(10, 10, 10, 10, 10, roles={1: "tool", 2: "tool"})
    assert cut_at(msgs, 1) == msgs[3:]
    kept, _ = asyncio.run(fitting(msgs, render_counting([]), lambda ids: len(ids) <= 40))
    assert kept == msgs[3:]
