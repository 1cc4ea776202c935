"""CORS for browser clients: answer preflight OPTIONS, add Access-Control-* to every response.

Off unless origins are configured (`--allowed-origins`): CORS only matters to browsers, and
`*` on a server without API keys would let any web page its users open drive it.
"""
from __future__ import annotations

import json

from rill.asgi.errors import APIError

DEFAULT_METHODS = ("GET", "POST")
DEFAULT_HEADERS = ("*",)
PREFLIGHT_MAX_AGE_S = 600
# Browsers send these without asking; allowed whatever the list says (as the Fetch spec has it).
SAFELISTED_HEADERS = frozenset({"accept", "accept-language", "content-language", "content-type"})
EXPOSED_HEADERS = b"x-request-id"


def parse_list(text: str) -> list[str]:
    """`a,b` or a JSON list (vLLM's form, `'["a", "b"]'`) -> ["a", "b"]."""
    text = text.strip()
    if text.startswith("["):
        items = json.loads(text)
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise ValueError(f"not a JSON list of strings: {text}")
    else:
        items = text.split(",")
    return [item.strip() for item in items if item.strip()]


def header(headers, name: bytes) -> str | None:
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None


class CorsPolicy:
    def __init__(self, origins=(), methods=DEFAULT_METHODS, headers=DEFAULT_HEADERS):
        self.any_origin = "*" in origins
        self.origins = frozenset(o.rstrip("/").lower() for o in origins if o != "*")
        self.any_method = "*" in methods
        self.methods = [m.upper() for m in methods if m != "*"]
        self.any_header = "*" in headers
        self.headers = [h.lower() for h in headers if h != "*"]
        self._allowed_headers = SAFELISTED_HEADERS | set(self.headers)

    @property
    def enabled(self) -> bool:
        return self.any_origin or bool(self.origins)

    def origin_allowed(self, origin: str) -> bool:
        return self.any_origin or origin.rstrip("/").lower() in self.origins

    def is_preflight(self, method: str, headers) -> bool:
        return (self.enabled and method == "OPTIONS" and header(headers, b"origin") is not None
                and header(headers, b"access-control-request-method") is not None)

    def preflight(self, headers) -> list[tuple[bytes, bytes]]:
        """The preflight answer's own headers (the origin's come from response_headers); 403 if refused."""
        origin = header(headers, b"origin") or ""
        method = (header(headers, b"access-control-request-method") or "").strip().upper()
        asked = [h.strip().lower() for h in (header(headers, b"access-control-request-headers") or "").split(",")
                 if h.strip()]
        if not self.origin_allowed(origin):
            raise APIError(403, f"Origin {origin!r} is not allowed (see --allowed-origins).", code="cors_origin_not_allowed")
        if not self.any_method and method not in self.methods:
            raise APIError(403, f"Method {method} is not allowed (see --allowed-methods).", code="cors_method_not_allowed")
        if not self.any_header and (refused := [h for h in asked if h not in self._allowed_headers]):
            raise APIError(403, f"Headers {', '.join(refused)} are not allowed (see --allowed-headers).",
                           code="cors_headers_not_allowed")
        # A "*" in Access-Control-Allow-Headers does not cover Authorization: echo what was asked.
        allow_headers = ", ".join(asked) if self.any_header else ", ".join(self.headers)
        allow_methods = method if self.any_method else ", ".join(self.methods)
        return [(b"access-control-allow-methods", allow_methods.encode("latin-1")),
                (b"access-control-allow-headers", allow_headers.encode("latin-1")),
                (b"access-control-max-age", str(PREFLIGHT_MAX_AGE_S).encode())]

    def response_headers(self, headers) -> list[tuple[bytes, bytes]]:
        """Added to every response to a request from an allowed origin (and Vary when it matters)."""
        if not self.enabled:
            return []
        origin = header(headers, b"origin")
        if origin is None:
            return []
        vary = [] if self.any_origin else [(b"vary", b"Origin")]
        if not self.origin_allowed(origin):
            return vary
        allow = b"*" if self.any_origin else origin.encode("latin-1")
        return [(b"access-control-allow-origin", allow), (b"access-control-expose-headers", EXPOSED_HEADERS), *vary]

    async def answer_preflight(self, headers, send) -> None:
        """204 with the preflight headers; APIError 403 when the origin, method or a header is refused."""
        await send({"type": "http.response.start", "status": 204, "headers": self.preflight(headers)})
        await send({"type": "http.response.body", "body": b""})
