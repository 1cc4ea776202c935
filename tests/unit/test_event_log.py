"""A streamed background response's event log (asgi/output/event_log.py) over a real SQLite store: readers on the
worker that runs the response (memory) and on another (the store), at any starting point, while it runs and after;
frames leave memory once stored; past the store's bytes, or cut off by a shutdown, a reader gets the Response's end."""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from rill.asgi.output.event_log import EventLog, Reader, follow, is_terminal
from rill.asgi.output.responses_format import sse_event
from rill.asgi.stores.base import Bounds, StoredResponse
from rill.asgi.stores.sqlite_store import SQLiteStore

RID = "resp_1"


def event(seq: int, kind: str = "response.output_text.delta", pad: int = 0) -> bytes:
    return sse_event({"type": kind, "sequence_number": seq, "delta": f"t{seq}" + "x" * pad})


def record(status: str = "in_progress") -> StoredResponse:
    return StoredResponse(id=RID, response={"id": RID, "status": status, "output_text": "done"}, input_items=[],
                          messages=[], events=0)


def numbers(frames: list[bytes]) -> list[int]:
    return [json.loads(f.split(b"data: ", 1)[1])["sequence_number"] for f in frames]


async def read_all(worker, after: int) -> list[bytes]:
    got = []
    async for frames in follow(worker, RID, after, Reader(tick=0.05)):
        got += frames
    return got


class Run:
    """The worker that runs the response: its log, written a few frames at a time, then the final Response stored
    after the log's end, as asgi/routes/responses.py does."""

    def __init__(self, store, n: int, pad: int = 0, terminal: bool = True):
        self.worker = SimpleNamespace(store=store, event_logs={})
        self.log = EventLog(store, RID)
        self.worker.event_logs[RID] = self.log
        self.n, self.pad, self.terminal = n, pad, terminal

    async def __call__(self, status: str = "completed") -> None:
        for first in range(0, self.n, 3):
            last = min(first + 3, self.n)
            self.log.add([event(seq, "response.completed" if self.terminal and seq == self.n - 1 else
                                "response.output_text.delta", self.pad) for seq in range(first, last)])
            await asyncio.sleep(0.01)
        await self.log.end()
        done = record(status)
        done.events, done.events_whole = self.log.stored, self.log.whole
        await self.log.store.put_response(done)
        self.worker.event_logs.pop(RID)
        self.log.close()


def store_at(tmp_path, **bounds) -> SQLiteStore:
    return SQLiteStore(tmp_path / "state.db", Bounds(100, 3600, **bounds), Bounds(100, 3600), durable=False)


def test_readers_here_and_elsewhere_get_every_event_from_any_point(tmp_path):
    async def go():
        store = store_at(tmp_path)
        await store.put_response(record())
        run = Run(store, 20)
        other = SimpleNamespace(store=store, event_logs={})  # another API worker: the store only
        got = await asyncio.gather(run(), read_all(run.worker, -1), read_all(run.worker, 7), read_all(other, -1),
                                   read_all(other, 11))
        _, here, here_late, there, there_late = got
        assert numbers(here) == numbers(there) == list(range(20)) and is_terminal(here[-1])
        assert numbers(here_late) == list(range(8, 20)) and numbers(there_late) == list(range(12, 20))
        assert here == there
        assert run.log.stored == 20 and run.log.whole and run.log.frames == []  # all stored, none left in memory
        assert numbers(await read_all(run.worker, 3)) == list(range(4, 20))  # after the end: from the store
        assert await read_all(other, 19) == []  # it had them all
        await store.close()
    asyncio.run(go())


def test_a_slow_reader_here_keeps_its_frames_in_memory(tmp_path):
    async def go():
        store = store_at(tmp_path)
        await store.put_response(record())
        run = Run(store, 30)
        reader = Reader(tick=0.05)
        stream = follow(run.worker, RID, -1, reader)
        first = await stream.__anext__()  # it reads one batch, then waits
        writing = asyncio.create_task(run())
        while run.log.stored < 27:
            await asyncio.sleep(0.01)
        assert run.log.base <= len(first)  # the frames it has not sent are still here
        rest = [f async for frames in stream for f in frames]
        await writing
        assert numbers(first + rest) == list(range(30))
        await store.close()
    asyncio.run(go())


def test_past_the_store_bytes_a_reader_elsewhere_gets_the_response_end(tmp_path):
    async def go():
        store = store_at(tmp_path, max_entry_bytes=3_000)
        await store.put_response(record())
        run = Run(store, 12, pad=400)  # about 470 bytes each, appended a few at a time: the store keeps some
        other = SimpleNamespace(store=store, event_logs={})
        _, here, there = await asyncio.gather(run(), read_all(run.worker, -1), read_all(other, -1))
        assert numbers(here) == list(range(12))  # from memory: all of them
        assert not run.log.kept and not run.log.whole and 0 < run.log.stored < 12
        kept = run.log.stored
        assert numbers(there) == [*range(kept), kept]  # the rest stands as the stored Response's end
        assert there[-1].startswith(b"event: response.completed\n") and b'"output_text":"done"' in there[-1]
        assert numbers(await read_all(other, 9)) == [10]  # after what it had: the end, numbered on
        await store.close()
    asyncio.run(go())


def test_a_log_cut_off_ends_with_the_stored_failure(tmp_path):
    """A worker that stops ends its background responses as failed, with no terminal event of their own."""
    async def go():
        store = store_at(tmp_path)
        await store.put_response(record())
        run = Run(store, 5, terminal=False)
        _, here = await asyncio.gather(run("failed"), read_all(run.worker, -1))
        assert numbers(here) == list(range(6)) and here[-1].startswith(b"event: response.failed\n")
        await store.close()
    asyncio.run(go())


def test_a_reader_of_a_deleted_response_ends(tmp_path):
    async def go():
        store = store_at(tmp_path)
        await store.put_response(record())
        await store.append_response_events(RID, 0, [event(0)])
        other = SimpleNamespace(store=store, event_logs={})
        reader = Reader(tick=0.05)
        stream = follow(other, RID, -1, reader)
        assert numbers(await stream.__anext__()) == [0]
        assert await stream.__anext__() == []  # still in progress: it waits
        await store.delete_response(RID)
        assert [f async for frames in stream for f in frames] == []
        await store.close()
    asyncio.run(go())
