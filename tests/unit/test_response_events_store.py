"""A streamed background response's events in the state store, on both back ends: appended in order, read after a
sequence number, kept across the Response's rewrites, counted in its bytes, gone with it."""
from __future__ import annotations

import msgspec
import pytest

from rill.asgi.stores.base import Bounds, StoredResponse
from tests.helpers.state_stores import Backend, run


@pytest.fixture(params=["sqlite", "redis"])
def backend(request, tmp_path):
    return Backend(request.param, tmp_path, request)


def in_progress(i: int, text: str = "") -> StoredResponse:
    return StoredResponse(id=f"resp_{i}", response={"id": f"resp_{i}", "status": "in_progress", "text": text},
                          input_items=[], messages=[], events=0)


def frames(first: int, n: int, size: int = 10) -> list[bytes]:
    return [b"event: e\ndata: " + msgspec.json.encode({"sequence_number": first + k, "pad": "x" * size}) + b"\n\n"
            for k in range(n)]


def test_events_append_in_order_and_read_after_a_number(backend):
    async def go():
        a, b = backend.store(), backend.store()  # two workers: one writes, the other reads
        await a.put_response(in_progress(1))
        assert await a.append_response_events("resp_1", 0, frames(0, 2))
        assert await a.append_response_events("resp_1", 2, frames(2, 1))
        assert not await a.append_response_events("resp_1", 2, frames(2, 1))  # a gap or a repeat: refused
        assert not await a.append_response_events("resp_1", 5, frames(5, 1))
        assert await b.response_events("resp_1", -1, 10) == frames(0, 3)
        assert await b.response_events("resp_1", 0, 1) == frames(1, 1)
        assert await b.response_events("resp_1", 2, 10) == []
        assert await b.response_events("resp_1", -7, 2) == frames(0, 2)
        done = in_progress(1, "all")
        done.response["status"], done.events, done.events_whole = "completed", 3, True
        await a.put_response(done)  # the final Response: the events stay
        assert await b.response_events("resp_1", -1, 10) == frames(0, 3)
        got = await b.get_response("resp_1")
        assert (got.events, got.events_whole, got.response["status"]) == (3, True, "completed")
        assert await b.response_events("resp_2", -1, 10) is None  # never stored
        assert not await a.append_response_events("resp_2", 0, frames(0, 1))
        assert await b.response_events("nope", -1, 10) is None
        await a.close()
        await b.close()
    run(go())


def test_events_go_with_their_response(backend):
    async def go():
        store = backend.store(responses=Bounds(2, 3600))
        for i in (1, 2):
            await store.put_response(in_progress(i))
            assert await store.append_response_events(f"resp_{i}", 0, frames(0, 3))
        assert backend.count("events") == 6
        assert await store.delete_response("resp_1")
        assert await store.response_events("resp_1", -1, 10) is None and backend.count("events") == 3
        backend.advance(0.01)
        await store.put_response(in_progress(3))
        await store.put_response(in_progress(4))  # the count bound evicts resp_2, with its events
        assert await store.response_events("resp_2", -1, 10) is None and backend.count("events") == 0
        await store.close()
    run(go())


def test_events_count_in_the_response_bytes(backend):
    """Past the response's bound no more events are kept; in the total they evict older responses, and a rewrite of
    the Response (its end) keeps counting them."""
    async def go():
        store = backend.store(responses=Bounds(100, 3600, max_bytes=11_000, max_entry_bytes=5_000))
        await store.put_response(in_progress(1))
        assert await store.append_response_events("resp_1", 0, frames(0, 3, size=1_000))
        assert not await store.append_response_events("resp_1", 3, frames(3, 2, size=1_000))  # past 5,000 (each about 1,040)
        assert await store.response_events("resp_1", 2, 10) == []
        backend.advance(0.01)
        await store.put_response(in_progress(2))
        assert await store.append_response_events("resp_2", 0, frames(0, 4, size=1_000))
        backend.advance(0.01)
        await store.put_response(in_progress(2))  # rewritten: its 4,000 bytes of events still count
        backend.advance(0.01)
        await store.put_response(in_progress(3))
        assert await store.append_response_events("resp_3", 0, frames(0, 3, size=1_000))
        # 3 + 4 + 3 events and three small bodies: under 11,000; one more event is not
        assert await store.get_response("resp_1") is not None
        assert await store.append_response_events("resp_3", 3, frames(3, 1, size=1_000))
        assert await store.get_response("resp_1") is None  # the oldest went for it
        assert len(await store.response_events("resp_2", -1, 10)) == 4
        await store.close()
    run(go())


def test_events_expire_with_their_response(backend):
    async def go():
        store = backend.store(responses=Bounds(100, 1.0))
        await store.put_response(in_progress(1))
        assert await store.append_response_events("resp_1", 0, frames(0, 2))
        backend.advance(0.6)
        await store.put_response(in_progress(1))  # rewritten: the events' TTL starts again with it
        backend.advance(0.6)
        assert len(await store.response_events("resp_1", -1, 10)) == 2
        backend.advance(0.6)
        assert await store.response_events("resp_1", -1, 10) is None
        assert not await store.append_response_events("resp_1", 2, frames(2, 1))
        await store.close()
    run(go())


def test_appending_events_is_a_write_the_ttl_counts_from(backend):
    """A background stream that runs longer than the TTL keeps its response and events while events come."""
    async def go():
        store = backend.store(responses=Bounds(100, 1.0))
        await store.put_response(in_progress(1))
        for first in range(3):
            backend.advance(0.6)
            assert await store.append_response_events("resp_1", first, frames(first, 1))
        assert (await store.get_response("resp_1")).response["status"] == "in_progress"  # 1.8 s after its put
        assert len(await store.response_events("resp_1", -1, 10)) == 3
        backend.advance(1.2)  # no write for longer than the TTL: gone
        assert await store.get_response("resp_1") is None and await store.response_events("resp_1", -1, 10) is None
        await store.close()
    run(go())
