"""OpenAI error objects: one exception type, its JSON body, and msgspec errors mapped onto it."""
from __future__ import annotations

import re

import msgspec


class APIError(Exception):
    """A request's fault (4xx) or the server's state (503); becomes `{"error": {...}}`."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: list[tuple[bytes, bytes]] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers  # extra response headers, e.g. WWW-Authenticate on a 401

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> bytes:
    return msgspec.json.encode({"error": {"message": message, "type": type, "param": param, "code": code}})


# `[...]` is msgspec's name for any value of a dict (logit_bias[...]): the param is the dict; a
# bad key reads "at `key` in `$.metadata`": the param is the dict too.
_PATH = re.compile(r"(?:at|in) `\$((?:\.[A-Za-z_][\w-]*|\[\d+\]|\[\.\.\.\])*)`")
_MISSING = re.compile(r"missing required field `([^`]+)`")


def from_validation_error(exc: msgspec.ValidationError | msgspec.DecodeError) -> APIError:
    """``Expected `int` >= 1 - at `$.max_tokens` `` -> 400 with param `max_tokens`."""
    text = str(exc)
    if isinstance(exc, msgspec.ValidationError):
        match = _PATH.search(text)
        param = match.group(1).lstrip(".").replace("[...]", "") if match and match.group(1) else None
        if missing := _MISSING.search(text):
            param = f"{param}.{missing.group(1)}" if param else missing.group(1)
        return APIError(400, text, param=param, code="invalid_value" if param else None)
    return APIError(400, f"The request body is not valid JSON: {text}", code="invalid_json")


def not_found(message: str, param: str | None = None) -> APIError:
    return APIError(404, message, param=param, code="model_not_found" if param == "model" else None)


def engine_unavailable(message: str = "The inference engine is not available.") -> APIError:
    return APIError(503, message, type="server_error", code="engine_unavailable")


def shutting_down() -> APIError:
    return APIError(503, "The server is shutting down.", type="server_error", code="shutting_down")


def renamed(exc: APIError, names: dict[str, str]) -> APIError:
    """`exc`, naming its field as another server's API spells it (`names`: the checked field's name -> that API's):
    a route of llama.cpp's, Ollama's, SGLang's or TGI's maps its request onto a completion's and shares its checks."""
    named = names.get(exc.param or "", exc.param)
    exc.message, exc.param = exc.message.replace(f"`{exc.param}`", f"`{named}`"), named
    return exc


def unsupported(param: str) -> APIError:
    return APIError(400, f"`{param}` is not supported by this server yet.", param=param, code="unsupported_parameter")


def queue_full(tokens: bool, retry_after_s: int) -> APIError:
    """429 from admission control, shaped as OpenAI's rate limits: type `requests` or `tokens`."""
    what = "prompt tokens" if tokens else "requests"
    return APIError(429, f"The server is at capacity: its queue of waiting {what} is full. "
                         f"Retry after {retry_after_s} s.", type="tokens" if tokens else "requests",
                    code="rate_limit_exceeded", headers=[(b"retry-after", str(retry_after_s).encode())])
