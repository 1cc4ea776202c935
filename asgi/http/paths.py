"""The one normalisation of a request path, computed once per request; auth and routing both read it.

`//v1//models/` and `/v1/models` must be the same path to the API-key guard and to the router:
when the two spelled paths differently, `//v1/...` reached keyed routes without a key.
"""
from __future__ import annotations

# OpenVINO Model Server serves the OpenAI API under /v3/; vLLM serves /responses without /v1.
_V1_ALIASES = {"v3": ("v1",), "responses": ("v1", "responses"), "conversations": ("v1", "conversations")}
_DOT_SEGMENTS = frozenset({".", ".."})


def normalize(path: str) -> str | None:
    """`path` as the routes are written: repeated and trailing slashes dropped, the /v3 and bare
    /responses, /conversations aliases mapped to /v1; None when a segment is `.` or `..`.

    The ASGI server has already decoded percent escapes, so `%2F` is a slash here like any other
    and `%2e%2e` is a `..`; nothing is decoded twice. Dot segments are refused, not resolved: no
    client of this API sends them, and resolving them would be a second way to spell every path.
    """
    segments = [s for s in path.split("/") if s]
    if any(s in _DOT_SEGMENTS for s in segments):
        return None
    if segments and (alias := _V1_ALIASES.get(segments[0])):
        segments[:1] = alias
    return "/" + "/".join(segments)
