"""OpenAI's Batches routes: create, list, retrieve, cancel. The work itself is asgi/batch/runner.py's.

A batch is checked whole when it is created (asgi/batch/jsonl.py): a file that breaks the
format gives a batch that is `failed` at once, with OpenAI's `errors`; a good one is
`validating` until a runner claims it.
"""
from __future__ import annotations

import asyncio
from typing import Annotated, Any
from urllib.parse import parse_qs

import msgspec
from msgspec import Meta

from rill.asgi.batch.jsonl import parse_lines
from rill.asgi.batch.records import (
    COMPLETION_WINDOWS,
    ENDPOINTS,
    Batch,
    Purpose,
    RequestCounts,
    Status,
    batch_errors,
    encode,
    new_batch_id,
    now,
)
from rill.asgi.errors import APIError
from rill.asgi.http.primitives import send_response
from rill.asgi.http.router import HTTPRequest
from rill.asgi.requests.body import decode_json
from rill.asgi.requests.bounds import Metadata
from rill.asgi.routes.files import file_or_404, limit_of

MAX_PAGE = 100


class CreateBatch(msgspec.Struct):
    input_file_id: Annotated[str, Meta(max_length=128)]
    endpoint: Annotated[str, Meta(max_length=64)]
    completion_window: Annotated[str, Meta(max_length=16)]
    metadata: Metadata | None = None
    output_expires_after: dict[str, Any] | None = None  # accepted; files here expire only when deleted


_create_decoder = msgspec.json.Decoder(CreateBatch)


def batch_404(batch_id: str) -> APIError:
    return APIError(404, f"No batch with id `{batch_id}` found.", code="not_found")


async def batch_or_404(http: HTTPRequest, batch_id: str) -> Batch:
    batch = await http.state.batches.get_batch(batch_id)
    if batch is None:
        raise batch_404(batch_id)
    return batch


async def create(http: HTTPRequest) -> None:
    req = decode_json(_create_decoder, http.body or b"{}")
    if req.endpoint not in ENDPOINTS:
        raise APIError(400, f"`endpoint` must be one of {', '.join(ENDPOINTS)}.", param="endpoint",
                       code="invalid_value")
    if req.completion_window not in COMPLETION_WINDOWS:
        raise APIError(400, "`completion_window` must be 24h.", param="completion_window", code="invalid_value")
    source = await file_or_404(http, req.input_file_id, "input_file_id")
    if source.purpose != Purpose.BATCH.value:
        raise APIError(400, f"The file `{source.id}` has purpose {source.purpose}; a batch's input needs purpose batch.",
                       param="input_file_id", code="invalid_value")
    settings = http.state.settings.http
    try:
        data = await asyncio.to_thread(http.state.files.read, source.id)
    except FileNotFoundError:
        raise APIError(404, f"The file `{source.id}` is gone from the disk.", param="input_file_id",
                       code="not_found") from None
    lines, errors = await asyncio.to_thread(parse_lines, data, req.endpoint, settings.batch_max_lines)
    del data
    created = now()
    batch = Batch(id=new_batch_id(), object="batch", endpoint=req.endpoint, input_file_id=source.id,
                  completion_window=req.completion_window, status=Status.VALIDATING.value, created_at=created,
                  expires_at=created + COMPLETION_WINDOWS[req.completion_window], metadata=req.metadata,
                  request_counts=RequestCounts(total=len(lines)))
    if errors:
        batch.errors = batch_errors(errors)
        batch.request_counts = RequestCounts()
        batch.move_to(Status.FAILED)
    else:
        batch.model = lines[0].model
    if not await http.state.batches.add_batch(batch, settings.files_max_count):
        raise APIError(400, f"This server keeps at most {settings.files_max_count} batches and none of them has "
                            "finished: wait for one.", param="input_file_id", code="too_many_batches")
    await send_response(http.send, 200, encode(batch))


async def retrieve(http: HTTPRequest) -> None:
    await send_response(http.send, 200, encode(await batch_or_404(http, http.params["batch_id"])))


async def list_batches(http: HTTPRequest) -> None:
    args = {k: v[-1] for k, v in parse_qs(http.query.decode("latin-1")).items()}
    limit = limit_of(args, 20, MAX_PAGE)
    after = args.get("after")
    got = await http.state.batches.list_batches(limit, after)
    if got is None:
        raise APIError(400, f"`after` names no batch: {str(after)[:80]!r}.", param="after", code="invalid_value")
    batches, has_more = got
    await send_response(http.send, 200, encode({
        "object": "list", "data": batches, "first_id": batches[0].id if batches else None,
        "last_id": batches[-1].id if batches else None, "has_more": has_more}))


CANCELLABLE = (Status.VALIDATING.value, Status.IN_PROGRESS.value)


async def cancel(http: HTTPRequest) -> None:
    """`cancelling` until the runner that holds the batch stops it (its lines in flight are
    aborted, what was written is kept), then `cancelled`."""
    batch_id = http.params["batch_id"]
    for _ in range(5):  # a runner's write can come between the read and the compare-and-set
        batch = await batch_or_404(http, batch_id)
        if batch.status in (Status.CANCELLING.value, Status.CANCELLED.value):
            break
        if batch.status not in CANCELLABLE:
            raise APIError(409, f"The batch `{batch_id}` is {batch.status}: only a batch that is validating or in "
                                "progress can be cancelled.", code="conflict")
        seen = batch.status
        batch.move_to(Status.CANCELLING)
        if await http.state.batches.update_batch(batch, (seen,)):
            break
    else:
        raise APIError(409, f"The batch `{batch_id}` kept changing; try again.", code="conflict")
    await send_response(http.send, 200, encode(batch))
