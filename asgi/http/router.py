"""The route table: (method, path pattern) -> handler, `{name}` segments as path parameters, and the
one signature of every handler: `async def handler(http: HTTPRequest) -> None`."""
from __future__ import annotations

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


Handler = Callable[[HTTPRequest], Awaitable[None]]


def _segments(path: str) -> tuple[str, ...]:
    return tuple(path.strip("/").split("/"))


def _bind(pattern: tuple[str, ...], parts: tuple[str, ...]) -> dict[str, str] | None:
    """The path parameters when `parts` fit `pattern`, else None. `{name}` takes one non-empty
    segment; a last `{name:path}` takes the rest, slashes included (model ids such as org/name)."""
    params: dict[str, str] = {}
    for i, seg in enumerate(pattern):
        if seg.endswith(":path}") and i == len(pattern) - 1:
            rest = "/".join(parts[i:])
            if not rest:
                return None
            params[seg[1:-len(":path}")]] = rest
            return params
        if i >= len(parts):
            return None
        if seg.startswith("{"):
            if not parts[i]:
                return None
            params[seg[1:-1]] = parts[i]
        elif seg != parts[i]:
            return None
    return params if len(parts) == len(pattern) else None


class Router:
    """Literal paths are found by one dict lookup; patterns are tried in order after them, so a
    literal path (POST /v1/responses/input_tokens) wins over a pattern that would also fit it."""

    def __init__(self, routes: list[tuple[str, str, Handler]]) -> None:
        self._literal = {(method, path): handler for method, path, handler in routes if "{" not in path}
        self._patterns = [(method, _segments(path), handler) for method, path, handler in routes if "{" in path]
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
