"""A batch's input file checked as OpenAI checks it, before any line runs.

Each line is `{"custom_id": str, "method": "POST", "url": <the batch's endpoint>, "body": {...}}`.
A file that breaks the format fails the batch with OpenAI's `errors` (a code, a message, the
parameter and the 1-based line): not JSON, a missing or duplicate `custom_id`, another method or
URL, a body that is not an object, lines that name different models, too many lines, an empty
file. What only the route can judge (a bad `messages`, an unknown model) runs and becomes that
line's error response in the error file, as OpenAI does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

MAX_ERRORS = 100  # errors listed on a failed batch (the rest are not read further)
MAX_CUSTOM_ID_LEN = 512


class _LineShape(msgspec.Struct):
    """A line as read: the body kept as its raw JSON (memory: a line's bytes, not its objects)."""

    custom_id: Any = None
    method: Any = None
    url: Any = None
    body: msgspec.Raw = msgspec.Raw(b"null")


class _BodyShape(msgspec.Struct):
    model: Any = None
    stream: Any = None


_line_decoder, _body_decoder = msgspec.json.Decoder(_LineShape), msgspec.json.Decoder(_BodyShape)


@dataclass(frozen=True)
class Line:
    number: int  # 1-based, in the file
    custom_id: str
    body: bytes  # the request's JSON, as the line holds it
    model: str


def _error(code: str, message: str, line: int | None, param: str | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


def parse_lines(data: bytes, endpoint: str, max_lines: int) -> tuple[list[Line], list[dict[str, Any]]]:
    """The requests of a batch input file, or the errors that fail it (at most MAX_ERRORS)."""
    lines: list[Line] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    model: str | None = None
    for number, raw in enumerate(data.split(b"\n"), 1):
        if len(errors) >= MAX_ERRORS:
            break
        if not raw.strip():
            continue
        if len(lines) >= max_lines:
            errors.append(_error("too_many_requests", f"A batch holds at most {max_lines} requests.", number))
            break
        line, error = _check(raw, number, endpoint, seen)
        if error is not None:
            errors.append(error)
            continue
        seen.add(line.custom_id)
        line_model = line.model
        if model is None:
            model = line_model
        elif line_model != model:
            errors.append(_error("mismatched_model", f"Every request of a batch must name the same model: line {number} "
                                 f"names {str(line_model)[:100]!r}, line {lines[0].number} {model[:100]!r}.",
                                 number, "body.model"))
            continue
        lines.append(line)
    if not lines and not errors:
        errors.append(_error("empty_file", "The input file holds no request.", None, "input_file_id"))
    return lines, errors


def _check(raw: bytes, number: int, endpoint: str, seen: set[str]) -> tuple[Line | None, dict[str, Any] | None]:
    try:
        obj = _line_decoder.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return None, _error("invalid_json_line", f"Line {number} is not a JSON object.", number)
    custom_id = obj.custom_id
    if not isinstance(custom_id, str) or not 1 <= len(custom_id) <= MAX_CUSTOM_ID_LEN:
        return None, _error("invalid_request", f"Line {number} needs a `custom_id`: a string of 1 to "
                            f"{MAX_CUSTOM_ID_LEN} characters.", number, "custom_id")
    if custom_id in seen:
        return None, _error("duplicate_custom_id", f"The custom_id {custom_id[:100]!r} of line {number} is "
                            "used by an earlier line; each request needs its own.", number, "custom_id")
    if obj.method != "POST":
        return None, _error("invalid_request", f"Line {number}: `method` must be POST.", number, "method")
    if obj.url != endpoint:
        return None, _error("invalid_url", f"Line {number}: `url` must be the batch's endpoint {endpoint}.",
                            number, "url")
    try:
        body = _body_decoder.decode(obj.body)
    except (msgspec.DecodeError, RecursionError):
        body = None
    if body is None:
        return None, _error("invalid_request", f"Line {number}: `body` must be a JSON object.", number, "body")
    if not isinstance(body.model, str):
        return None, _error("missing_required_parameter", f"Line {number}: `body.model` must be a string.",
                            number, "body.model")
    if body.stream:
        return None, _error("invalid_request", f"Line {number}: a batch request cannot stream.", number,
                            "body.stream")
    return Line(number, custom_id, bytes(obj.body), body.model), None
