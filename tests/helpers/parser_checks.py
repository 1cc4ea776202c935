"""Feeding an OutputParser hand-written text split every way: streamed deltas must add up to the
same message as the text pushed whole (call ids aside, which are fresh per call)."""
from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable

# OpenAI's shape, or the id Kimi K2 writes itself (its parser keeps it, as vLLM's does)
CALL_ID = re.compile(r"call_\w{8,}|functions\.[\w.-]+:\d+")


def run(make_parser: Callable[..., object], text: str, cuts: Iterable[int] = ()) -> tuple[dict, bool, list[dict]]:
    """(merged message, called_tools, the deltas) for `text` pushed in pieces cut at `cuts`."""
    parser = make_parser()
    deltas, start = [], 0
    for cut in [*cuts, len(text)]:
        deltas.append(parser.push(text[start:cut]))
        start = cut
    deltas.append(parser.finish())
    return merge_message(deltas), parser.called_tools, deltas


def without_ids(message: dict) -> dict:
    calls = [{**c, "id": "call"} for c in message["tool_calls"] or []]
    return {**message, "tool_calls": calls or None}


def check_every_split(make_parser, text: str) -> dict:
    """The message of `text` whole, after checking that every one- and two-cut split and the
    character-by-character stream give the same message, and that ids look like OpenAI's."""
    whole, called, _ = run(make_parser, text)
    expected = without_ids(whole)
    splits = [[i] for i in range(len(text) + 1)]
    splits += [list(pair) for pair in itertools.combinations(range(0, len(text) + 1, 3), 2)]
    splits.append(list(range(len(text))))
    for cuts in splits:
        message, called_here, deltas = run(make_parser, text, cuts)
        assert without_ids(message) == expected, (cuts, message)
        assert called_here == called
        for delta in deltas:
            for piece in delta.get("tool_calls", ()):
                if "id" in piece:
                    assert CALL_ID.fullmatch(piece["id"]) and piece["type"] == "function", piece
                    assert piece["function"]["name"]
    for call in whole["tool_calls"] or []:
        assert CALL_ID.fullmatch(call["id"]), call["id"]
    return whole


def merge_message(deltas: list[dict]) -> dict:
    """The whole message that a choice's deltas add up to: content, reasoning_content and
    tool_calls (by index: id, type, name, and the arguments pieces joined)."""
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, dict] = {}
    for delta in deltas:
        content.append(delta.get("content") or "")
        reasoning.append(delta.get("reasoning_content") or "")
        for piece in delta.get("tool_calls", ()):
            call = calls.setdefault(piece["index"], {"id": None, "type": "function",
                                                     "function": {"name": None, "arguments": ""}})
            call["id"] = piece.get("id", call["id"])
            function = piece.get("function", {})
            if "name" in function:
                call["function"]["name"] = function["name"]
            call["function"]["arguments"] += function.get("arguments", "")
    message: dict = {"content": "".join(content) or None, "reasoning_content": "".join(reasoning) or None}
    message["tool_calls"] = [calls[i] for i in sorted(calls)] or None
    return message
