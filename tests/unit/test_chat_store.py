"""Stored Chat Completions on both back ends: kept and read by another worker, listed in order with filters and
pages, metadata replaced, deleted, and bounded (count, bytes, TTL, one record's size)."""
from __future__ import annotations

import pytest

from rill.asgi.stores.base import Bounds
from rill.asgi.stores.chat_store import StoredChat
from rill.asgi.stores.open_chats import chat_store_for
from tests.helpers.state_stores import ROOMY, Backend, run


@pytest.fixture(params=["sqlite", "redis"])
def backend(request, tmp_path):
    return Backend(request.param, tmp_path, request)


def chats(backend: Backend, bounds: Bounds = ROOMY):
    return chat_store_for(backend.store(), bounds)


def cid(i: int) -> str:
    """Ids whose text sorts neither as they were made nor the reverse (100, 99, ...: "100" < "96" < "99")."""
    return f"chatcmpl-{100 - i}"


def record(i: int, model: str = "m", metadata: dict | None = None, text: str = "hi") -> StoredChat:
    completion = {"id": cid(i), "object": "chat.completion", "model": model, "metadata": metadata or {},
                  "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}
    return StoredChat(completion=completion, messages=[{"id": f"{cid(i)}-0", "role": "user", "content": "q"}])


async def ids(store, **kw) -> tuple[list[str], bool]:
    args = {"model": None, "metadata": {}, "limit": 100, "order": "asc", "after": None, **kw}
    got = await store.list(**args)
    assert got is not None
    return [c["id"] for c in got[0]], got[1]


def test_kept_listed_filtered_paged_updated_and_deleted(backend):
    async def go():
        a, b = chats(backend), chats(backend)  # two workers
        for i in range(5):
            assert await a.put(record(i, model="x" if i % 2 else "m", metadata={"run": "r1" if i < 3 else "r2"}))
        got = await b.get(cid(3))
        assert got.completion["model"] == "x" and got.messages[0]["id"] == f"{cid(3)}-0"
        assert await ids(b) == ([cid(i) for i in range(5)], False)
        assert await ids(b, order="desc", limit=2) == ([cid(4), cid(3)], True)
        assert await ids(b, order="desc", limit=2, after=cid(3)) == ([cid(2), cid(1)], True)
        assert await ids(b, limit=2, after=cid(2)) == ([cid(3), cid(4)], False)
        assert await ids(b, model="x") == ([cid(1), cid(3)], False)
        assert await ids(b, metadata={"run": "r1"}, limit=1) == ([cid(0)], True)
        assert await ids(b, model="m", metadata={"run": "r2"}) == ([cid(4)], False)
        assert await ids(b, metadata={"run": "r1", "other": "y"}) == ([], False)
        assert await b.list(None, {}, 10, "asc", "chatcmpl-none") is None  # `after` names none
        assert await b.list(None, {}, 10, "asc", "resp_1") is None
        updated = await b.set_metadata(cid(0), {"run": "r2", "k": "v"})
        assert updated.completion["metadata"] == {"run": "r2", "k": "v"}
        assert (await a.get(cid(0))).completion["metadata"] == {"run": "r2", "k": "v"}
        assert await ids(a, metadata={"run": "r2"}) == ([cid(0), cid(3), cid(4)], False)
        assert await b.set_metadata("chatcmpl-none", {}) is None
        assert await a.delete(cid(0)) and not await b.delete(cid(0))
        assert await b.get(cid(0)) is None and await ids(b, metadata={"run": "r2"}) == (
            [cid(3), cid(4)], False)
        for bad in ("chatcmpl-1/../x", "resp_1", "chatcmpl-", "x" * 300):
            assert await a.get(bad) is None and not await a.delete(bad)
        for store in (a, b):
            await store.store.close()
    run(go())


def test_the_oldest_go_past_the_count_and_the_bytes(backend):
    async def go():
        store = chats(backend, Bounds(3, 3600))
        for i in range(5):
            await store.put(record(i))
        assert await ids(store) == ([cid(2), cid(3), cid(4)], False)
        sized = chats(backend, Bounds(100, 3600, max_bytes=2500, max_entry_bytes=1200))
        for i in range(5, 9):
            assert await sized.put(record(i, text="x" * 900))
        kept, _ = await ids(sized)
        assert kept == [cid(7), cid(8)], kept  # two of about 1,100 bytes fit in 2,500
        assert not await sized.put(record(9, text="x" * 2000))  # past one record's bytes: not kept
        assert await sized.get(cid(9)) is None
        await store.store.close()
        await sized.store.close()
    run(go())


def test_each_is_kept_its_ttl_from_creation(backend):
    async def go():
        store = chats(backend, Bounds(100, 0.5))
        await store.put(record(1))
        backend.advance(0.3)
        await store.set_metadata(cid(1), {"a": "b"})  # an update does not renew it
        backend.advance(0.3)
        assert await store.get(cid(1)) is None and await ids(store) == ([], False)
        assert await store.set_metadata(cid(1), {}) is None and not await store.delete(cid(1))
        await store.put(record(2))
        assert await ids(store) == ([cid(2)], False)
        await store.store.close()
    run(go())


def test_a_disabled_store_keeps_nothing(backend):
    async def go():
        store = chats(backend, Bounds(0, 3600))
        assert not await store.put(record(1))
        assert await store.get(cid(1)) is None
        assert await store.list(None, {}, 10, "asc", None) == ([], False)
        await store.store.close()
    run(go())
