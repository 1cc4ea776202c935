"""The route table: (method, path pattern) -> handler, `{name:shape}` segments as path parameters,
and the one signature of every handler: `async def handler(http: HTTPRequest) -> None`."""
from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class HTTPRequest:
    """What a handler gets: the worker's state, the request as read, and the ASGI channels."""

    state: Any  # asgi.state.WorkerState (the router itself knows nothing of the worker)
    receive: Callable[[], Awaitable[dict]]
    send: Callable[[dict], Awaitable[None]]
    body: bytes = b""  # read (within --max-request-body) before the handler runs, for POST
    query: bytes = b""
    params: dict[str, str] = field(default_factory=dict)  # the pattern's `{name}` segments
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)  # as ASGI gives them


Handler = Callable[[HTTPRequest], Awaitable[None]]

# A bare `{name}` (or `{name:id}`) holds a plain id; a Router is given the shapes of its own ids
# (`{conversation_id:conv}`). A segment of another shape binds nothing: a 404 before a handler, or
# a store key built from it, sees it (`DELETE /v1/conversations/index` once deleted the Redis
# store's index).
ID_SHAPE = r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}"
# A last `{name:path}` takes the rest of the path, slashes included (model ids such as org/name):
# printable text of at most this many characters.
MAX_PATH_PARAM_LEN = 256


@dataclass(frozen=True, slots=True)
class _Param:
    name: str
    shape: re.Pattern | None  # None: the rest of the path


def _segments(path: str) -> tuple[str, ...]:
    return tuple(path.strip("/").split("/"))


def _compile(pattern: str, shapes: dict[str, re.Pattern]) -> tuple[str | _Param, ...]:
    """The pattern's segments: literal strings, and a _Param for each `{name}` or `{name:shape}`."""
    out: list[str | _Param] = []
    segments = _segments(pattern)
    for i, seg in enumerate(segments):
        if not seg.startswith("{"):
            out.append(seg)
            continue
        name, _, shape = seg[1:-1].partition(":")
        if shape == "path":
            if i != len(segments) - 1:
                raise ValueError(f"{pattern}: only the last parameter may be a path")
            out.append(_Param(name, None))
        elif (shape or "id") in shapes:
            out.append(_Param(name, shapes[shape or "id"]))
        else:
            raise ValueError(f"{pattern}: unknown parameter shape {shape!r} (one of {', '.join(shapes)}, path)")
    return tuple(out)


def _bind(pattern: tuple[str | _Param, ...], parts: tuple[str, ...]) -> dict[str, str] | None:
    """The path parameters when `parts` fit `pattern`, else None. A parameter takes one segment of
    its shape; a last `{name:path}` takes the rest, slashes included."""
    params: dict[str, str] = {}
    for i, seg in enumerate(pattern):
        if isinstance(seg, _Param) and seg.shape is None:
            rest = "/".join(parts[i:])
            if not rest or len(rest) > MAX_PATH_PARAM_LEN or not rest.isprintable():
                return None
            params[seg.name] = rest
            return params
        if i >= len(parts):
            return None
        if isinstance(seg, str):
            if seg != parts[i]:
                return None
        elif seg.shape.fullmatch(parts[i]) is None:
            return None
        else:
            params[seg.name] = parts[i]
    return params if len(parts) == len(pattern) else None


class Router:
    """Literal paths are found by one dict lookup; patterns are tried in order after them, so a
    literal path (POST /v1/responses/input_tokens) wins over a pattern that would also fit it.
    Paths come in normalised (asgi.http.paths): no empty, `.` or `..` segments. `shapes`: the
    regular expressions (matched whole) that `{name:shape}` names, beside `id`."""

    def __init__(self, routes: list[tuple[str, str, Handler]], shapes: dict[str, str] | None = None) -> None:
        compiled = {name: re.compile(regex) for name, regex in {"id": ID_SHAPE, **(shapes or {})}.items()}
        self._literal = {(method, path): handler for method, path, handler in routes if "{" not in path}
        self._patterns = [(method, _compile(path, compiled), handler) for method, path, handler in routes
                          if "{" in path]
        self._literal_methods: dict[str, list[str]] = {}
        for method, path in self._literal:
            self._literal_methods.setdefault(path, []).append(method)

    def match(self, method: str, path: str) -> tuple[Handler | None, dict[str, str], list[str]]:
        """(handler, path parameters, []) for a route of this method and path; else (None, {},
        the methods this path answers): empty for an unknown path (404), else a 405's Allow."""
        handler = self._literal.get((method, path))
        if handler is not None:
            return handler, {}, []
        allowed = list(self._literal_methods.get(path, ()))
        parts = _segments(path)
        for route_method, pattern, handler in self._patterns:
            params = _bind(pattern, parts)
            if params is None:
                continue
            if route_method == method:
                return handler, params, []
            allowed.append(route_method)
        return None, {}, allowed
