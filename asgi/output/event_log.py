"""A streamed background response's events (`background` with `stream`): kept, and read back from any point.

The worker that runs the response records every frame its ResponseStream makes (`Recorded`) in an `EventLog`: in
memory for the readers on this worker, and appended to the state store a batch at a time for the readers on any
other (one append in flight; what comes meanwhile goes in the next). The create's own stream is one such reader, from
the start: a client that leaves loses nothing, the response runs on. `GET /v1/responses/{id}?stream=true
&starting_after=N`, on any worker, sends the events after N and follows the rest as they come (`send_events`).

A frame leaves memory once the store has it and no reader on this worker still needs it; a reader that falls behind
reads it from the store. Past the response's bytes in the store (16 MiB by default) no more events are kept, and a
reader from another worker, or a later one, gets the stored Response's end as its terminal event instead.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from rill.asgi.engine_link.generate import ChoiceDelta, Generation
from rill.asgi.http.primitives import DisconnectWatcher
from rill.asgi.http.sse import SSEWriter
from rill.asgi.output.responses_format import TERMINAL, ResponseStream, sse_event
from rill.asgi.stores.base import StateStore, StoreUnavailable

log = logging.getLogger("rill.api")

_TERMINAL_PREFIXES = tuple(b"event: " + kind.encode() + b"\n" for kind in set(TERMINAL.values()))
PAGE = 256  # events a reader takes from the store at once
POLL_S = 0.05  # how often a reader on another worker looks for new events


def is_terminal(frame: bytes) -> bool:
    return frame.startswith(_TERMINAL_PREFIXES)


class Reader:
    """One reader's wake-up: new frames, the log's end, or its client leaving."""

    def __init__(self, tick: float) -> None:
        self.wake = asyncio.Event()
        self.gone = False
        self.tick = tick  # the longest wait between two looks at the keep-alive

    def leave(self) -> None:
        self.gone = True
        self.wake.set()

    async def sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), max(seconds, 0.0))
        self.wake.clear()


class EventLog:
    def __init__(self, store: StateStore, response_id: str) -> None:
        self.store, self.response_id = store, response_id
        self.frames: list[bytes] = []
        self.base = 0  # the sequence number of frames[0]: the ones before it are in the store only
        self.stored = 0  # how many the store holds
        self.kept = True  # False once the store refused some: past the response's bytes, or it is gone
        self.ended = False
        self.last_terminal = False
        self.readers: dict[Reader, int] = {}  # a reader on this worker: the next sequence number it sends
        self._flushing: asyncio.Task | None = None

    @property
    def count(self) -> int:
        return self.base + len(self.frames)

    @property
    def whole(self) -> bool:
        """The store holds every event, up to the terminal one."""
        return self.kept and self.stored == self.count and self.last_terminal

    def add(self, frames: list[bytes]) -> list[bytes]:
        if frames:
            self.frames += frames
            self.last_terminal = is_terminal(frames[-1])
            self._wake()
            if self._flushing is None or self._flushing.done():
                self._flushing = asyncio.get_running_loop().create_task(self._flush())
        return frames

    async def _flush(self) -> None:
        while self.kept and self.stored < self.count:
            batch = self.frames[self.stored - self.base:]
            try:
                self.kept = await self.store.append_response_events(self.response_id, self.stored, batch)
            except StoreUnavailable:
                return  # tried again with the next frames, and at the end
            except Exception:  # a bug: the stream and the response go on, their events are no longer kept
                log.exception("response %s: its events could not be stored", self.response_id)
                self.kept = False
                return
            if self.kept:
                self.stored += len(batch)
                self.trim()
            else:
                log.warning("response %s: the state store keeps no more of its events (past its bytes, or gone)",
                            self.response_id)

    def trim(self) -> None:
        """Frames the store has and no reader here still needs leave memory."""
        upto = min([self.stored, *self.readers.values()])
        if upto > self.base:
            del self.frames[:upto - self.base]
            self.base = upto

    async def end(self) -> None:
        """After the last frame: the store gets what it lacks, before the final Response is stored, so that a reader
        who finds the Response ended finds all its events there."""
        if self._flushing is not None:
            await asyncio.shield(self._flushing)
        await self._flush()

    def close(self) -> None:
        """Once the final Response is stored: readers here that still wait go on from the store."""
        self.ended = True
        self._wake()

    def _wake(self) -> None:
        for reader in self.readers:
            reader.wake.set()


class Recorded:
    """ResponseStream as asgi/output/respond.py drives it, every frame also handed to the log."""

    ends_with_done = False
    opens_with_first_token = False

    def __init__(self, shape: ResponseStream, events: EventLog) -> None:
        self.shape, self.events = shape, events

    def opening(self, gen: Generation) -> list[bytes]:
        return self.events.add(self.shape.opening(gen))

    def frames(self, deltas: list[ChoiceDelta], gen: Generation) -> list[bytes]:
        return self.events.add(self.shape.frames(deltas, gen))

    def failure(self, exc, gen: Generation) -> list[bytes]:
        return self.events.add(self.shape.failure(exc, gen))

    def closing(self, gen: Generation) -> list[bytes] | None:
        frames = self.shape.closing(gen)
        return None if frames is None else self.events.add(frames)

    def add(self, deltas: list[ChoiceDelta]) -> None:
        self.shape.add(deltas)

    def body(self, gen: Generation) -> bytes | None:
        return self.shape.body(gen)


async def follow(state, response_id: str, after: int, reader: Reader) -> AsyncIterator[list[bytes]]:
    """The frames after sequence number `after`, as they come, up to the terminal one: from this worker's log while
    it runs the response, else from the store. An empty list after each wait, for the keep-alives. Ends early if
    the response is deleted or evicted."""
    nxt = after + 1
    while not reader.gone:
        events = state.event_logs.get(response_id)
        if events is not None and not events.ended and nxt >= events.base:
            events.readers[reader] = nxt  # while it is here, nothing it has not sent leaves memory
            try:
                while not (events.ended or reader.gone):
                    if frames := events.frames[nxt - events.base:]:
                        nxt += len(frames)
                        events.readers[reader] = nxt
                        yield frames
                        if is_terminal(frames[-1]):
                            return
                    else:
                        await reader.sleep(reader.tick)  # the log wakes it
                        yield []
            finally:
                events.readers.pop(reader, None)
                events.trim()
            continue
        frames = await state.store.response_events(response_id, nxt - 1, PAGE)
        if frames is None:
            return
        if frames:
            nxt += len(frames)
            yield frames
            if is_terminal(frames[-1]):
                return
            continue
        # None new: the Response (read only now, not at every poll) says whether it has ended
        entry = await state.store.get_response(response_id)
        if entry is None:
            return
        if entry.response["status"] in ("queued", "in_progress"):
            await reader.sleep(POLL_S)
            yield []
            continue
        if await state.store.response_events(response_id, nxt - 1, 1):
            continue  # stored between the two reads: its final Response comes after its last events
        if not entry.events_whole:  # not all kept: the stored Response's end stands for the rest
            yield [sse_event({"type": TERMINAL[entry.response["status"]],
                              "sequence_number": max(nxt, entry.events or 0), "response": entry.response})]
        return


async def send_events(http, response_id: str, after: int) -> None:
    """An SSE stream of the response's events after `after`, with keep-alives while none come; the client leaving
    ends only the stream."""
    keepalive_s = http.state.settings.http.sse_keepalive_s
    reader = Reader(tick=min(1.0, keepalive_s / 2))
    watcher = DisconnectWatcher(http.receive, on_disconnect=reader.leave)
    sse = SSEWriter(http.send, keepalive_s)
    try:
        await sse.start()
        try:
            async for frames in follow(http.state, response_id, after, reader):
                for frame in frames:
                    await sse.event(frame)
                if not frames and sse.keepalive_due_in() <= 0:
                    await sse.keepalive()
        except StoreUnavailable:  # logged by the store; the status went out already, so the stream just ends
            pass
        if not reader.gone:
            await sse.close()
    finally:
        watcher.stop()
