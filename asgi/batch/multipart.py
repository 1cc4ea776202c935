"""A bounded multipart/form-data parser for `POST /v1/files` (RFC 7578), on the stdlib alone.

The body is read whole under a byte limit first (asgi/routes/files.py), so parsing is a few
`bytes.find` calls: at most MAX_PARTS parts, each with at most MAX_HEADER_BYTES of headers. A
malformed body is a 400 naming what is wrong, never an exception of another kind.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from rill.asgi.errors import APIError

MAX_PARTS = 8  # the SDK sends two (purpose, file) and perhaps expires_after[...]
MAX_HEADER_BYTES = 8 << 10
MAX_BOUNDARY_LEN = 70  # RFC 2046
_PARAM = re.compile(r';\s*([A-Za-z0-9_*-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^;\s]*)')


@dataclass(frozen=True)
class Part:
    name: str
    filename: str | None
    data: bytes


def _bad(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param, code="invalid_multipart")


def _params(header: str) -> dict[str, str]:
    out = {}
    for key, value in _PARAM.findall(header):
        if value.startswith('"'):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        out[key.lower()] = value
    return out


def boundary_of(content_type: str) -> bytes:
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind != "multipart/form-data":
        raise APIError(415, "POST /v1/files takes multipart/form-data (fields `purpose` and `file`).",
                       code="unsupported_media_type")
    boundary = _params(content_type).get("boundary", "")
    if not 1 <= len(boundary) <= MAX_BOUNDARY_LEN or not boundary.isascii():
        raise _bad("The multipart Content-Type needs a boundary of 1 to 70 ASCII characters.")
    return boundary.encode()


def parse(body: bytes, content_type: str) -> dict[str, Part]:
    """The parts by name (a name sent twice: the first part); 400 on a malformed body."""
    delimiter = b"--" + boundary_of(content_type)
    start = body.find(delimiter)
    if start < 0:
        raise _bad("The multipart body holds no part.")
    parts: dict[str, Part] = {}
    pos = start + len(delimiter)
    for _ in range(MAX_PARTS + 1):
        if body.startswith(b"--", pos):  # the closing delimiter
            return parts
        if not body.startswith(b"\r\n", pos):
            raise _bad("A multipart delimiter must end its line.")
        head_end = body.find(b"\r\n\r\n", pos + 2, pos + 2 + MAX_HEADER_BYTES + 4)
        if head_end < 0:
            raise _bad(f"A multipart part's headers must end within {MAX_HEADER_BYTES} bytes.")
        end = _delimiter_at(body, b"\r\n" + delimiter, head_end + 4)
        if end < 0:
            raise _bad("The multipart body ends before its closing delimiter.")
        if len(parts) >= MAX_PARTS:
            raise _bad(f"A multipart body may hold at most {MAX_PARTS} parts.")
        part = _part(body[pos + 2 : head_end], body[head_end + 4 : end])
        parts.setdefault(part.name, part)
        pos = end + 2 + len(delimiter)
    raise _bad(f"A multipart body may hold at most {MAX_PARTS} parts.")


def _delimiter_at(body: bytes, delimiter: bytes, start: int) -> int:
    """The next delimiter line: the boundary followed by CRLF or `--` (the same bytes followed by
    anything else are content)."""
    while (at := body.find(delimiter, start)) >= 0:
        if body[at + len(delimiter) : at + len(delimiter) + 2] in (b"\r\n", b"--"):
            return at
        start = at + 1
    return -1


def _part(head: bytes, data: bytes) -> Part:
    disposition = None
    for line in head.decode("latin-1").split("\r\n"):
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-disposition":
            disposition = value.strip()
    if disposition is None or disposition.split(";", 1)[0].strip().lower() != "form-data":
        raise _bad("Each multipart part needs `Content-Disposition: form-data; name=...`.")
    params = _params(disposition)
    if not params.get("name"):
        raise _bad("A multipart part has no name.")
    filename = params.get("filename")
    if filename is not None:  # the SDK sends UTF-8 bytes in the quoted string
        filename = filename.encode("latin-1").decode("utf-8", "replace")
    return Part(params["name"][:256], filename, data)
