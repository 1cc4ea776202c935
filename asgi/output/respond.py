"""Drive one Generation to the client: as an SSE stream, or aggregated into one JSON body.

The endpoint-specific shape (chat or completions) comes from a Formatter; this module owns the
order of events: role chunk, deltas, finish, usage, [DONE]; keep-alives while waiting; an
error event when the engine fails after the headers went out.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

import msgspec

from asgi.engine_link.generate import KEEPALIVE, ChoiceDelta, Generation, GenerationFailed, Usage
from asgi.errors import APIError, error_body
from asgi.http.primitives import DisconnectWatcher, send_response
from asgi.http.sse import SSEWriter

if TYPE_CHECKING:
    from asgi.requests.nvext import NvExtReply

log = logging.getLogger("rill.api")


class Formatter(Protocol):
    """`usage` on chunks: the usage so far, with stream_options.continuous_usage_stats; else None."""

    def opening_chunks(self, usage: Usage | None) -> list[bytes]: ...
    def chunks(self, deltas: list[ChoiceDelta], usage: Usage | None) -> list[bytes]: ...
    def add(self, deltas: list[ChoiceDelta]) -> None: ...  # the non-streamed answer accumulates
    def usage_chunk(self, usage: Usage) -> bytes: ...
    def choiceless_chunk(self, **fields) -> bytes: ...
    def body(self, usage: Usage) -> bytes: ...


async def respond(gen: Generation, fmt: Formatter, *, stream: bool, receive, send,
                  keepalive_s: float, include_usage: bool, continuous_usage: bool = False,
                  nvext: NvExtReply | None = None) -> None:
    """`nvext`: what the request's nvext asks to be sent back (annotations, response fields)."""
    watcher = DisconnectWatcher(receive, on_disconnect=gen.on_disconnect)
    failed = True
    try:
        await gen.start()
        if stream:
            failed = await _stream(gen, fmt, send, keepalive_s, include_usage, continuous_usage, nvext)
        else:
            await _aggregate(gen, fmt, send, nvext)
            failed = False
    finally:
        watcher.stop()
        gen.record(failed=failed)


async def _stream(gen: Generation, fmt: Formatter, send, keepalive_s: float, include_usage: bool,
                  continuous_usage: bool, nvext: NvExtReply | None) -> bool:
    """Returns whether the engine failed the request after the headers went out."""
    sse = SSEWriter(send, keepalive_s)
    await sse.start()
    for event in nvext.start_events() if nvext else ():
        await sse.event(event)
    for chunk in fmt.opening_chunks(gen.usage() if continuous_usage else None):
        await sse.data(chunk)
    try:
        async for item in gen.deltas(sse.keepalive_due_in):
            if item is KEEPALIVE:
                await sse.keepalive()
            else:
                for chunk in fmt.chunks(item, gen.usage() if continuous_usage else None):
                    await sse.data(chunk)
    except GenerationFailed as exc:
        log.error("request %s failed mid-stream: %s", gen.request_id, exc)
        await sse.data(error_body(str(exc), "server_error", code=exc.code))
        await sse.done()
        return True
    if gen.disconnected:
        return False
    if nvext:
        for event in nvext.end_events(gen):
            await sse.event(event)
        if fields := nvext.fields(gen):
            await sse.data(fmt.choiceless_chunk(nvext=fields))
    if include_usage:
        await sse.data(fmt.usage_chunk(gen.usage()))
    await sse.done()
    return False


async def _aggregate(gen: Generation, fmt: Formatter, send, nvext: NvExtReply | None) -> None:
    try:
        async for item in gen.deltas():
            fmt.add(item)
    except GenerationFailed as exc:
        raise APIError(exc.status, str(exc), type="server_error", code=exc.code) from None
    if gen.disconnected:
        return
    body = fmt.body(gen.usage())
    if nvext and (fields := nvext.body_fields(gen)):
        body = msgspec.json.encode({**msgspec.json.decode(body), "nvext": fields})
    await send_response(send, 200, body)
