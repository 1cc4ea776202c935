"""Gemma 4's arguments, `{city:<|"|>Paris<|"|>,days:3,hours:[9,12],opts:{metric:true}}`, read into a JSON value.

The syntax, as Gemma 4's template writes a call's arguments back and vLLM's `gemma4` parser reads them: an object's
keys are bare (or between the string markers), its pairs `key:value` joined by commas; a string is any text between
two `<|"|>` markers, kept as written; an array holds values joined by commas; anything else (up to a comma or a
closing bracket) is a bare value: `true`, `false`, `null` (or `none`, `nil`), a number, else the text itself.
Whitespace around the parts is layout. A value cut off (the output ended) keeps what it has: a string its text, an
object or array its complete items, a bare value its text. Past MAX_DEPTH nested objects and arrays (a model's
output, which a prompt can steer), the rest of the text is one string: the reading is never deeper than that.
"""
from __future__ import annotations

import json
from typing import Any

QUOTE = '<|"|>'
_LAYOUT = " \t\r\n"
MAX_DEPTH = 64


def read_arguments(text: str) -> Any:
    """The value `text` spells (an object for a call's arguments); see the module's docstring."""
    value, _ = _value(text, _skip(text, 0), 0)
    return value


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _LAYOUT:
        i += 1
    return i


def _value(text: str, i: int, depth: int) -> tuple[Any, int]:
    if depth > MAX_DEPTH:
        return text[i:], len(text)
    if text.startswith(QUOTE, i):
        end = text.find(QUOTE, i + len(QUOTE))
        if end < 0:
            return text[i + len(QUOTE):], len(text)
        return text[i + len(QUOTE):end], end + len(QUOTE)
    if text.startswith("{", i):
        return _object(text, i + 1, depth + 1)
    if text.startswith("[", i):
        return _array(text, i + 1, depth + 1)
    end = i
    while end < len(text) and text[end] not in ",}]":
        end += 1
    return _bare(text[i:end].strip()), end


def _object(text: str, i: int, depth: int) -> tuple[dict, int]:
    result: dict[str, Any] = {}
    while True:
        i = _skip(text, i)
        if i >= len(text):
            return result, i
        if text[i] == "}":
            return result, i + 1
        if text[i] == ",":
            i += 1
            continue
        if text.startswith(QUOTE, i):  # a key between the markers
            key, i = _value(text, i, depth)
            colon = text.find(":", i)
        else:
            colon = text.find(":", i)
            key = text[i:colon if colon >= 0 else len(text)].strip()
        if colon < 0:  # a key cut off: no pair
            return result, len(text)
        value, i = _value(text, _skip(text, colon + 1), depth)
        result[str(key)] = value


def _array(text: str, i: int, depth: int) -> tuple[list, int]:
    items: list[Any] = []
    while True:
        i = _skip(text, i)
        if i >= len(text):
            return items, i
        if text[i] in "]}":  # (a stray `}` ends it too)
            return items, i + 1
        if text[i] == ",":
            i += 1
            continue
        value, i = _value(text, i, depth)
        items.append(value)


def _bare(word: str) -> Any:
    lowered = word.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("null", "none", "nil"):
        return None
    try:
        number = json.loads(word)
    except ValueError:
        return word
    return number if isinstance(number, (int, float)) and not isinstance(number, bool) else word
