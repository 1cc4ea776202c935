"""OpenAI's Files routes for the Batch API: upload (multipart), list, retrieve, content, delete.

Only `purpose=batch` is taken; a batch's results are files of purpose `batch_output`. The bytes
live on disk (asgi/batch/file_disk.py), the records in the state store (asgi/stores/batch_store.py).
Bounded: an upload's bytes and lines, and the number of files kept (--files-max-bytes,
--batch-max-lines, --files-max-count).
"""
from __future__ import annotations

import asyncio
import os
from urllib.parse import parse_qs

from rill.asgi.batch import multipart
from rill.asgi.batch.file_disk import CHUNK_BYTES
from rill.asgi.batch.records import FileObject, Purpose, encode, new_file_id, now
from rill.asgi.errors import APIError
from rill.asgi.http.primitives import read_body, send_response
from rill.asgi.http.router import HTTPRequest

MAX_FILENAME_LEN = 255
MAX_LIST = 10_000  # `limit` of GET /v1/files, as OpenAI
MULTIPART_OVERHEAD = 64 << 10  # headers, boundaries and the purpose field around the file


def _header(http: HTTPRequest, name: bytes) -> str:
    for key, value in http.headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return ""


def file_404(file_id: str, param: str | None = None) -> APIError:
    return APIError(404, f"No file with id `{file_id}` found.", param=param, code="not_found")


async def file_or_404(http: HTTPRequest, file_id: str, param: str | None = None) -> FileObject:
    record = await http.state.batches.get_file(file_id)
    if record is None:
        raise file_404(file_id, param)
    return record


async def upload(http: HTTPRequest) -> None:
    settings = http.state.settings.http
    content_type = _header(http, b"content-type")
    multipart.boundary_of(content_type)  # a 415 before the body is read
    try:
        body = await read_body(http.receive, settings.files_max_bytes + MULTIPART_OVERHEAD)
    except APIError as exc:
        raise _too_large(settings.files_max_bytes, "more") if exc.status == 413 else exc from None
    parts = multipart.parse(body, content_type)
    del body
    purpose = parts.get("purpose")
    if purpose is None:
        raise APIError(400, "`purpose` is required (batch).", param="purpose", code="missing_required_parameter")
    if purpose.data != Purpose.BATCH.value.encode():
        raise APIError(400, "This server takes files of purpose `batch` only (for the Batch API).", param="purpose",
                       code="invalid_value")
    upload_part = parts.get("file")
    if upload_part is None or upload_part.filename is None:
        raise APIError(400, "`file` is required: the JSONL file, as a multipart file part.", param="file",
                       code="missing_required_parameter")
    data = upload_part.data
    if len(data) > settings.files_max_bytes:
        raise _too_large(settings.files_max_bytes, str(len(data)))
    if data.count(b"\n") + (not data.endswith(b"\n")) > settings.batch_max_lines:
        raise APIError(400, f"A batch input file holds at most {settings.batch_max_lines} lines.", param="file",
                       code="too_many_lines")
    record = FileObject(id=new_file_id(), bytes=len(data), created_at=now(),
                        filename=upload_part.filename[:MAX_FILENAME_LEN] or "upload.jsonl", purpose=Purpose.BATCH.value,
                        object="file", status="processed")
    disk = http.state.files
    await asyncio.to_thread(disk.write, record.id, data)
    if not await http.state.batches.add_file(record, settings.files_max_count):
        await asyncio.to_thread(disk.delete, record.id)
        raise APIError(400, f"This server keeps at most {settings.files_max_count} files: delete some first.",
                       param="file", code="too_many_files")
    await send_response(http.send, 200, encode(record))


upload.reads_body = True  # multipart, under its own limit: App.route reads no JSON body first


def _too_large(limit: int, size: str) -> APIError:
    return APIError(413, f"A file may hold at most {limit} bytes (--files-max-bytes); this one holds {size}.",
                    param="file", code="file_too_large")


def _query(http: HTTPRequest) -> dict[str, str]:
    return {k: v[-1] for k, v in parse_qs(http.query.decode("latin-1")).items()}


def limit_of(args: dict[str, str], default: int, most: int) -> int:
    try:
        limit = int(args.get("limit", str(default)))
    except ValueError:
        limit = 0
    if not 1 <= limit <= most:
        raise APIError(400, f"`limit` must be an integer from 1 to {most}.", param="limit", code="invalid_value")
    return limit


async def list_files(http: HTTPRequest) -> None:
    args = _query(http)
    limit = limit_of(args, MAX_LIST, MAX_LIST)
    order = args.get("order", "desc")
    if order not in ("asc", "desc"):
        raise APIError(400, "`order` must be asc or desc.", param="order", code="invalid_value")
    purpose = args.get("purpose")
    if purpose is not None and purpose not in {p.value for p in Purpose}:
        purpose = "none"  # a purpose this server keeps no file of: an empty list, as OpenAI
    after = args.get("after")
    got = await http.state.batches.list_files(purpose, limit, order, after)
    if got is None:
        raise APIError(400, f"`after` names no file: {str(after)[:80]!r}.", param="after", code="invalid_value")
    files, has_more = got
    await send_response(http.send, 200, encode({
        "object": "list", "data": files, "first_id": files[0].id if files else None,
        "last_id": files[-1].id if files else None, "has_more": has_more}))


async def retrieve(http: HTTPRequest) -> None:
    await send_response(http.send, 200, encode(await file_or_404(http, http.params["file_id"])))


async def content(http: HTTPRequest) -> None:
    file_id = http.params["file_id"]
    await file_or_404(http, file_id)
    try:
        f = await asyncio.to_thread(open, http.state.files.path(file_id), "rb")
    except FileNotFoundError:
        raise file_404(file_id) from None
    try:  # a chunk at a time: a file is up to --files-max-bytes
        size = os.fstat(f.fileno()).st_size
        await http.send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/octet-stream"), (b"content-length", str(size).encode())]})
        while chunk := await asyncio.to_thread(f.read, CHUNK_BYTES):
            await http.send({"type": "http.response.body", "body": chunk, "more_body": True})
        await http.send({"type": "http.response.body", "body": b""})
    finally:
        f.close()


async def delete(http: HTTPRequest) -> None:
    file_id = http.params["file_id"]
    if not await http.state.batches.delete_file(file_id):
        raise file_404(file_id)
    await asyncio.to_thread(http.state.files.delete, file_id)
    await send_response(http.send, 200, encode({"id": file_id, "object": "file", "deleted": True}))
