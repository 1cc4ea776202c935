"""A checker of a Responses API event stream's grammar, and each event against OpenAI's spec."""
from __future__ import annotations

import json
import re

from tests.helpers.openapi import load_spec, validate

TERMINAL = {"response.completed", "response.incomplete", "response.failed"}


def event_schemas() -> dict[str, str]:
    """Event type -> the spec's schema name for it (ResponseStreamEvent's branches)."""
    schemas = load_spec()["components"]["schemas"]
    out = {}
    for ref in schemas["ResponseStreamEvent"]["anyOf"]:
        name = ref["$ref"].rsplit("/", 1)[-1]
        out[schemas[name]["properties"]["type"]["enum"][0]] = name
    return out


def sse_lines(text: str) -> list[str]:
    """A stream's lines as SSE ends them: at CR LF, CR or LF only. str.splitlines() would also
    split at U+2028, U+0085 and the like, which JSON carries raw inside a data line."""
    return re.split(r"\r\n|\r|\n", text)


def parse_sse(lines) -> list[tuple[str | None, dict]]:
    """(the `event:` name, the data's JSON) per event; keep-alive comments skipped."""
    events, name = [], None
    for line in lines:
        if line.startswith("event: "):
            name = line[len("event: "):]
        elif line.startswith("data: "):
            events.append((name, json.loads(line[len("data: "):])))
            name = None
    return events


def check_stream(named_events: list[tuple[str | None, dict]]) -> dict:
    """Asserts the grammar; returns the terminal event's response."""
    schemas = event_schemas()
    events = []
    for name, event in named_events:
        assert name == event["type"], f"event line {name!r} differs from the data's type {event['type']!r}"
        validate(schemas[event["type"]], event)
        events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    terminals = [e for e in events if e["type"] in TERMINAL]
    assert len(terminals) == 1 and events[-1] is terminals[0], "exactly one terminal event, the last"
    response = terminals[0]["response"]
    response_id = events[0]["response"]["id"]
    assert all(e["response"]["id"] == response_id for e in events if "response" in e)

    open_items: dict[int, dict] = {}  # output_index -> the item added
    open_parts: set[tuple[str, int]] = set()
    texts: dict[str, str] = {}
    arguments: dict[str, str] = {}
    reasoning: dict[str, str] = {}
    done_items = []
    for e in events[2:-1]:
        kind = e["type"]
        if kind == "response.output_item.added":
            assert not open_items, "an item is added only when the one before is done"
            assert e["output_index"] == len(done_items)
            open_items[e["output_index"]] = e["item"]
            continue
        if kind == "response.output_item.done":
            added = open_items.pop(e["output_index"])
            assert added["id"] == e["item"]["id"] and added["type"] == e["item"]["type"]
            assert not any(item_id == added["id"] for item_id, _ in open_parts), "a content part left open"
            done_items.append(e["item"])
            continue
        item = open_items.get(e["output_index"])
        assert item is not None and item["id"] == e["item_id"], f"{kind} outside its item"
        if kind == "response.content_part.added":
            open_parts.add((e["item_id"], e["content_index"]))
            texts[e["item_id"]] = ""
        elif kind == "response.content_part.done":
            open_parts.remove((e["item_id"], e["content_index"]))
            assert e["part"]["text"] == texts[e["item_id"]]
        elif kind == "response.output_text.delta":
            assert (e["item_id"], e["content_index"]) in open_parts
            texts[e["item_id"]] += e["delta"]
        elif kind == "response.output_text.done":
            assert e["text"] == texts[e["item_id"]]
        elif kind == "response.function_call_arguments.delta":
            arguments[e["item_id"]] = arguments.get(e["item_id"], "") + e["delta"]
        elif kind == "response.function_call_arguments.done":
            assert e["arguments"] == arguments.get(e["item_id"], "")
        elif kind == "response.reasoning_text.delta":
            reasoning[e["item_id"]] = reasoning.get(e["item_id"], "") + e["delta"]
        elif kind == "response.reasoning_text.done":
            assert e["text"] == reasoning.get(e["item_id"], "")
        else:
            raise AssertionError(f"unexpected event {kind}")
    assert not open_items, "an item was never done"
    assert [i["id"] for i in response["output"]] == [i["id"] for i in done_items]
    assert response["output"] == done_items
    joined = "".join(texts[i["id"]] for i in done_items if i["type"] == "message")
    assert response["output_text"] == joined
    validate("Response", response)
    return response
