"""Merging an OutputParser's delta fields: two pieces into one chunk's delta, or all into a message."""
from __future__ import annotations


def merge_delta(into: dict, piece: dict) -> dict:
    """Adds `piece` to `into` (returned): text fields concatenated, tool calls merged by index
    (id, type and name from a call's first piece, arguments concatenated)."""
    for key, value in piece.items():
        if key == "tool_calls":
            _merge_tool_calls(into.setdefault("tool_calls", []), value)
        elif isinstance(value, str) and isinstance(into.get(key), str):
            into[key] += value
        else:
            into[key] = value
    return into


def _merge_tool_calls(calls: list[dict], pieces: list[dict]) -> None:
    for piece in pieces:
        call = next((c for c in calls if c["index"] == piece["index"]), None)
        if call is None:
            calls.append({**piece, "function": dict(piece.get("function") or {})})
            continue
        for key in ("id", "type"):
            if call.get(key) is None and piece.get(key) is not None:
                call[key] = piece[key]
        function = piece.get("function") or {}
        if call["function"].get("name") is None and function.get("name") is not None:
            call["function"]["name"] = function["name"]
        if function.get("arguments"):
            call["function"]["arguments"] = call["function"].get("arguments", "") + function["arguments"]


def message(merged: dict) -> dict:
    """The non-streamed `message` of a choice whose deltas were merged into `merged`."""
    content = merged.get("content") or ""
    calls = sorted(merged.get("tool_calls") or [], key=lambda c: c["index"])
    out: dict = {"role": "assistant", "content": content if content or not calls else None, "refusal": None}
    if merged.get("reasoning_content"):
        out["reasoning_content"] = merged["reasoning_content"]
    if calls:
        out["tool_calls"] = [{"id": c.get("id"), "type": c.get("type") or "function",
                              "function": {"name": c["function"].get("name"),
                                           "arguments": c["function"].get("arguments", "")}} for c in calls]
    return out
