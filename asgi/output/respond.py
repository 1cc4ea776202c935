"""Drive one Generation to the client: as an SSE stream, or aggregated into one JSON body.

Every generating route goes through `respond`: it owns the lifecycle (the disconnect watcher,
keep-alives while waiting, the end of a failed stream, the request's record), and a Shape of the
route's own says what the frames and the body are: `ChunkStream` for chat and completions
(role chunk, deltas, finish, usage, [DONE]), the Responses API's typed events
(asgi/output/responses_format.py ResponseStream).
"""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

import msgspec

from rill.asgi.engine_link.generate import KEEPALIVE, ChoiceDelta, Generation, GenerationFailed, Usage
from rill.asgi.errors import error_body
from rill.asgi.http.primitives import DisconnectWatcher, send_response
from rill.asgi.http.sse import KEEPALIVE as KEEPALIVE_COMMENT
from rill.asgi.http.sse import SSE_HEADERS, SSEWriter, frame

if TYPE_CHECKING:
    from rill.asgi.requests.nvext import NvExtReply

log = logging.getLogger("rill.api")


BeforeLast = Callable[[bool], Awaitable[None]]


class Shape(Protocol):
    """A route's answer: whole SSE frames for a stream, or the body of a plain request."""

    ends_with_done: bool  # `data: [DONE]` closes the stream (chat, completions), else it just ends
    # The opening frames (made at the start) go out with the first token (chat's role chunk, a
    # Message's message_start), so a harness timing the first event measures the real TTFT;
    # keep-alives hold the connection until then. False: at once (response.created).
    opens_with_first_token: bool
    # Optional: the whole frame sent while nothing else is (`: keep-alive` when a shape has none;
    # a Message stream's `ping` event).
    keepalive: bytes
    # Optional: the stream's response headers (SSE's when a shape has none; Ollama's NDJSON)
    headers: list[tuple[bytes, bytes]]

    def opening(self, gen: Generation) -> list[bytes]: ...
    def frames(self, deltas: list[ChoiceDelta], gen: Generation) -> list[bytes]: ...
    def failure(self, exc: GenerationFailed, gen: Generation) -> list[bytes]: ...  # the engine failed mid-stream
    def closing(self, gen: Generation) -> list[bytes] | None: ...  # after the last delta; None: the client left
    def add(self, deltas: list[ChoiceDelta]) -> None: ...  # the plain answer accumulates
    def body(self, gen: Generation) -> bytes | None: ...  # None: the client left


async def respond(gen: Generation, shape: Shape, *, stream: bool, receive, send, keepalive_s: float,
                  before_last: BeforeLast | None = None, started: bool = False) -> bool:
    """Returns whether the engine failed the request (an error event went out mid-stream); a
    failure before any byte was sent raises APIError. `before_last(failed)` runs once the answer
    is whole and before its last bytes go out (the Responses API stores it there, so a client
    that has read the end finds it stored). `started`: the caller submitted the generation already."""
    watcher = DisconnectWatcher(receive, on_disconnect=gen.on_disconnect)
    failed = True
    last = before_last or _nothing
    try:
        if not started:
            await gen.start()
        if stream:
            failed = await _stream(gen, shape, send, keepalive_s, last)
        else:
            await _aggregate(gen, shape, send, last)
            failed = False
    finally:
        watcher.stop()
        gen.record(failed=failed)
    return failed


async def _nothing(failed: bool) -> None:
    return None


async def _stream(gen: Generation, shape: Shape, send, keepalive_s: float, last: BeforeLast) -> bool:
    sse = SSEWriter(send, keepalive_s, getattr(shape, "keepalive", KEEPALIVE_COMMENT),
                    getattr(shape, "headers", SSE_HEADERS))
    await sse.start()
    held = shape.opening(gen)
    if not shape.opens_with_first_token:
        for raw in held:
            await sse.event(raw)
        held = []
    try:
        async for item in gen.deltas(sse.keepalive_due_in):
            if item is KEEPALIVE:
                await sse.keepalive()
            else:
                for raw in [*held, *shape.frames(item, gen)]:
                    await sse.event(raw)
                held = []
    except GenerationFailed as exc:
        log.error("request %s failed mid-stream: %s", gen.request_id, exc)
        if gen.ctx is not None:  # the trace's error code: the status stays the 200 already sent
            gen.ctx.error_code = exc.code
        frames = [*held, *shape.failure(exc, gen)]
        await last(True)
        for raw in frames:
            await sse.event(raw)
        await _end(sse, shape)
        return True
    closing = shape.closing(gen)
    if closing is None:
        return False
    await last(False)
    for raw in [*held, *closing]:  # a stream with no token still opens before it closes
        await sse.event(raw)
    await _end(sse, shape)
    return False


async def _end(sse: SSEWriter, shape: Shape) -> None:
    await (sse.done() if shape.ends_with_done else sse.close())


async def _aggregate(gen: Generation, shape: Shape, send, last: BeforeLast) -> None:
    async for item in gen.deltas():  # a GenerationFailed is the app's to answer, as any APIError
        shape.add(item)
    body = shape.body(gen)
    if body is not None:
        await last(False)
        await send_response(send, 200, body)


class Formatter(Protocol):
    """Chat's or completions' chunks (asgi/output/chat_format.py, completion_format.py). `usage`
    on chunks: the usage so far, with stream_options.continuous_usage_stats; else None."""

    def opening_chunks(self, usage: Usage | None) -> list[bytes]: ...
    def chunks(self, deltas: list[ChoiceDelta], usage: Usage | None) -> list[bytes]: ...
    def add(self, deltas: list[ChoiceDelta]) -> None: ...
    def usage_chunk(self, usage: Usage) -> bytes: ...
    def choiceless_chunk(self, **fields) -> bytes: ...
    def body(self, usage: Usage) -> bytes: ...


class ChunkStream:
    """Chat's and completions' shape: `data:` chunks in order (role chunk, deltas, finish), the
    usage chunk when asked, nvext's annotations and fields, and [DONE]."""

    ends_with_done = True
    opens_with_first_token = True
    keepalive = KEEPALIVE_COMMENT

    def __init__(self, fmt: Formatter, *, include_usage: bool, continuous_usage: bool = False,
                 nvext: NvExtReply | None = None) -> None:
        self.fmt = fmt
        self.include_usage = include_usage
        self.continuous_usage = continuous_usage
        self.nvext = nvext  # what the request's nvext asks to be sent back

    def _usage(self, gen: Generation) -> Usage | None:
        return gen.usage() if self.continuous_usage else None

    def opening(self, gen: Generation) -> list[bytes]:
        """Made now (their usage is the prompt's); sent with the first token, as OpenAI and vLLM do."""
        events = self.nvext.start_events() if self.nvext else []
        return [*events, *(frame(chunk) for chunk in self.fmt.opening_chunks(self._usage(gen)))]

    def frames(self, deltas: list[ChoiceDelta], gen: Generation) -> list[bytes]:
        return [frame(chunk) for chunk in self.fmt.chunks(deltas, self._usage(gen))]

    def failure(self, exc: GenerationFailed, gen: Generation) -> list[bytes]:
        return [frame(error_body(str(exc), "server_error", code=exc.code))]

    def closing(self, gen: Generation) -> list[bytes] | None:
        if gen.disconnected:
            return None
        out = []
        if self.nvext:
            out += self.nvext.end_events(gen)
            if fields := self.nvext.fields(gen):
                out.append(frame(self.fmt.choiceless_chunk(nvext=fields)))
        if self.include_usage:
            out.append(frame(self.fmt.usage_chunk(gen.usage())))
        return out

    def add(self, deltas: list[ChoiceDelta]) -> None:
        self.fmt.add(deltas)

    def body(self, gen: Generation) -> bytes | None:
        if gen.disconnected:
            return None
        body = self.fmt.body(gen.usage())
        if self.nvext and (fields := self.nvext.body_fields(gen)):
            body = msgspec.json.encode({**msgspec.json.decode(body), "nvext": fields})
        return body
