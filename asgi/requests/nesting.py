"""Client JSON's nesting bound: free-form values of a decoded body, and JSON text parsed after it.

A body's free-form fields (`Any`, `dict[str, Any]`: tool parameters, schemas, template kwargs,
input items) and JSON given as text (a schema as a string, a tool call's `arguments`) are walked
or parsed again after msgspec: the chat template's `tojson`, the grammar compiler and Python's
json all recurse. Python's limit (1000 frames, shared with the stack above the parse) makes a
RecursionError of a deep value, and xgrammar's compile time grows with a schema's depth (here 24 ms
at 65 levels, 1.2 s at 257), so one bound applies to all of them, far above what real schemas
use (OpenAI's structured outputs allow 10 levels of objects).
"""
from __future__ import annotations

import json
from typing import Any

import msgspec

MAX_DEPTH = 64  # nested arrays and objects in one free-form value or JSON text


class TooDeep(ValueError):
    """JSON nested deeper than MAX_DEPTH: the client's fault (a 400), never a RecursionError."""

    def __init__(self) -> None:
        super().__init__(f"it nests deeper than {MAX_DEPTH} levels of arrays and objects")


def exceeds(value: Any, max_depth: int = MAX_DEPTH) -> bool:
    """Whether `value` nests more than `max_depth` lists and dicts (walked without recursion)."""
    if not isinstance(value, (list, dict)):
        return False
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            return True
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, (list, dict)):
                stack.append((child, depth + 1))
    return False


def deep_field(obj: msgspec.Struct) -> str | None:
    """The path (`tools[0].function.parameters`) of the first field of a decoded body whose
    free-form value nests too deep, or None. Structs and lists of structs are the body's own
    shape and bounded by their types; only what lies below a struct's field is counted. The path
    is spelled only for the field found: every body is walked, few are too deep."""
    for name in obj.__struct_fields__:
        value = getattr(obj, name)
        if isinstance(value, msgspec.Struct):
            if (below := deep_field(value)) is not None:
                return f"{name}.{below}"
        elif isinstance(value, list) and value and isinstance(value[0], msgspec.Struct):
            for i, item in enumerate(value):
                if (below := deep_field(item)) is not None:
                    return f"{name}[{i}].{below}"
        elif exceeds(value):
            return name
    return None


def loads(text: str) -> Any:
    """json.loads for client text: ValueError if it is not JSON, TooDeep (a ValueError too) if it
    nests deeper than MAX_DEPTH."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise TooDeep() from None
    if exceeds(value):
        raise TooDeep()
    return value
