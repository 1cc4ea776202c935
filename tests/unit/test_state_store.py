"""The state store's back ends against the same cases: SQLite (a file) and Redis (a real
redis-server on a loopback port). Bounds, items, deletes that really delete, failures."""
from __future__ import annotations

import pytest

from rill.asgi.stores.base import Bounds, Conversation, StoredResponse, StoreUnavailable
from rill.asgi.stores.open import StoreURLError, check_url, open_store
from rill.asgi.stores.redis_store import RedisStore, _without_password
from rill.asgi.stores.sqlite_store import SQLiteStore
from tests.helpers.redis_server import free_port
from tests.helpers.state_stores import ROOMY, Backend, run


@pytest.fixture(params=["sqlite", "redis"])
def backend(request, tmp_path):
    return Backend(request.param, tmp_path, request)


def response(i: int, text: str = "hello", items: bool = True) -> StoredResponse:
    """As written; as read back, `items=False` (get_response leaves the input items to their pages)."""
    return StoredResponse(id=f"resp_{i}", response={"id": f"resp_{i}", "status": "completed", "text": text},
                          input_items=[item(i)] if items else [], messages=[{"role": "user", "content": text}])


def conversation(i: int) -> Conversation:
    return Conversation(id=f"conv_{i}", created_at=1, metadata={"k": str(i)})


def item(i: int, text: str | None = None) -> dict:
    return {"id": f"item_{i}", "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": str(i) if text is None else text}]}


async def item_ids(store, conversation_id: str) -> list[str] | None:
    got = await store.all_items(conversation_id)
    return None if got is None else [i["id"] for i in got[0]]


def test_response_round_trip_and_delete(backend):
    async def go():
        store = backend.store()
        await store.put_response(response(1))
        assert await store.get_response("resp_1") == response(1, items=False)
        assert (await store.page_response_items("resp_1", 20, "asc", None)).items == [item(1)]
        assert await store.get_response("resp_2") is None
        assert await store.delete_response("resp_1") is True
        assert await store.delete_response("resp_1") is False
        assert await store.get_response("resp_1") is None
        await store.close()
    run(go())


def test_count_bound_holds_across_workers(backend):
    """Two stores (two API workers) writing in turn: the oldest go, the total never passes 3."""
    async def go():
        a, b = backend.store(responses=Bounds(3, 3600)), backend.store(responses=Bounds(3, 3600))
        for i in range(8):
            await (a if i % 2 else b).put_response(response(i))
            backend.advance(0.01)
            assert backend.count("responses") <= 3
        assert [await a.get_response(f"resp_{i}") is not None for i in range(8)] == [False] * 5 + [True] * 3
        await a.close()
        await b.close()
    run(go())


def test_a_reader_sees_the_other_workers_later_writes(backend):
    """A worker that read a response must see what another worker writes afterwards (no stale
    snapshot held open between calls)."""
    async def go():
        a, b = backend.store(), backend.store()
        await b.put_response(response(1))
        assert await a.get_response("resp_1") is not None
        await b.put_response(response(2))
        assert await a.get_response("resp_2") is not None
        await b.put_conversation(conversation(1), [item(1)])
        assert await item_ids(a, "conv_1") is not None and await a.get_conversation("conv_1") is not None
        await b.add_items("conv_1", [item(2)])
        assert len(await item_ids(a, "conv_1")) == 2
        assert len((await a.page_items("conv_1", 5, "desc", None)).items) == 2
        await a.close()
        await b.close()
    run(go())


def test_ttl_counts_from_the_last_write(backend):
    async def go():
        store = backend.store(responses=Bounds(100, 1.0))
        await store.put_response(response(1))
        await store.put_response(response(2))
        backend.advance(0.6)
        await store.put_response(response(2))  # rewritten (a response finishing): its TTL starts again
        backend.advance(0.6)
        assert await store.get_response("resp_1") is None
        assert await store.get_response("resp_2") is not None
        await store.put_response(response(3))
        assert backend.count("responses") == 2  # the expired one is gone from the store, not only hidden
        await store.close()
    run(go())


def test_conversation_items(backend):
    async def go():
        store = backend.store()
        await store.put_conversation(conversation(1), [item(1), item(2)])
        assert await store.add_items("conv_1", [item(3)]) is True
        assert await item_ids(store, "conv_1") == ["item_1", "item_2", "item_3"]
        assert await store.get_item("conv_1", "item_2") == item(2)
        assert await store.delete_item("conv_1", "item_2") is True
        assert await store.delete_item("conv_1", "item_2") is False
        updated = conversation(1)
        updated.metadata = {"k": "new"}
        await store.put_conversation(updated)  # metadata only: the items stay
        assert (await store.get_conversation("conv_1")).metadata == {"k": "new"}
        assert await item_ids(store, "conv_1") == ["item_1", "item_3"]
        assert await store.add_items("conv_9", [item(9)]) is False
        assert await item_ids(store, "conv_9") is None
        assert await store.delete_conversation("conv_1") is True
        assert await store.get_conversation("conv_1") is None and await item_ids(store, "conv_1") is None
        assert backend.count("items") == 0
        await store.close()
    run(go())


def test_evicted_conversations_take_their_items(backend):
    async def go():
        store = backend.store(conversations=Bounds(2, 3600))
        for i in range(4):
            await store.put_conversation(conversation(i), [item(10 * i), item(10 * i + 1)])
            backend.advance(0.01)
        assert [await store.get_conversation(f"conv_{i}") is not None for i in range(4)] == [False, False, True, True]
        assert backend.count("conversations") == 2 and backend.count("items") == 4
        await store.close()
    run(go())


def test_conversation_ttl_counts_from_creation(backend):
    async def go():
        store = backend.store(conversations=Bounds(100, 1.0))
        await store.put_conversation(conversation(1), [item(1)])
        backend.advance(0.6)
        assert await store.add_items("conv_1", [item(2)]) is True  # does not extend its life
        backend.advance(0.6)
        assert await store.get_conversation("conv_1") is None
        assert await store.add_items("conv_1", [item(3)]) is False
        await store.close()
    run(go())


def test_sqlite_keeps_everything_across_a_restart(tmp_path):
    async def go():
        path = tmp_path / "durable.db"
        first = SQLiteStore(path, Bounds(10, 3600), Bounds(10, 3600), durable=True)
        await first.put_response(response(1))
        await first.put_conversation(conversation(1), [item(1)])
        await first.close()
        second = SQLiteStore(path, Bounds(10, 3600), Bounds(10, 3600), durable=True)
        assert await second.get_response("resp_1") == response(1, items=False)
        assert await item_ids(second, "conv_1") == ["item_1"]
        await second.close()
    run(go())


def test_sqlite_delete_leaves_no_copy_on_disk(tmp_path):
    """DELETE really deletes: the content is in neither the database file nor its WAL."""
    async def go():
        path = tmp_path / "state.db"
        store = SQLiteStore(path, Bounds(10, 3600), Bounds(10, 3600), durable=True)
        await store.put_response(response(1, text="SECRET-PASSAGE-41"))
        await store.put_response(response(2, text="kept"))
        await store.put_conversation(conversation(1), [item(1, "SECRET-ITEM-77")])
        on_disk = b"".join(p.read_bytes() for p in tmp_path.iterdir())
        assert b"SECRET-PASSAGE-41" in on_disk and b"SECRET-ITEM-77" in on_disk  # the check can see it
        assert await store.delete_response("resp_1")
        assert await store.delete_conversation("conv_1")
        on_disk = b"".join(p.read_bytes() for p in tmp_path.iterdir())
        assert b"SECRET-PASSAGE-41" not in on_disk and b"SECRET-ITEM-77" not in on_disk
        assert b"kept" in on_disk
        await store.close()
    run(go())


def test_a_corrupt_sqlite_file_is_unavailable_not_fatal(tmp_path):
    async def go():
        path = tmp_path / "state.db"
        path.write_bytes(b"this is not a database" * 200)
        store = SQLiteStore(path, Bounds(10, 3600), Bounds(10, 3600), durable=True)
        with pytest.raises(StoreUnavailable, match="DatabaseError"):
            await store.get_response("resp_1")
        path.unlink()  # fixed: the next call opens it again
        await store.put_response(response(1))
        assert await store.get_response("resp_1") == response(1, items=False)
        await store.close()
    run(go())


def test_an_unreachable_redis_is_unavailable(tmp_path):
    async def go():
        store = RedisStore(f"redis://127.0.0.1:{free_port()}/0", Bounds(10, 3600), Bounds(10, 3600))
        with pytest.raises(StoreUnavailable, match="Connection"):
            await store.get_response("resp_1")
        await store.close()
    run(go())


def test_urls(tmp_path):
    check_url("")
    check_url("sqlite:////var/lib/rill/state.db")
    check_url("redis://localhost:6379/0")
    for bad in ("postgres://x", "sqlite://relative.db", "sqlite:///"):
        with pytest.raises(StoreURLError):
            check_url(bad)
    default = open_store("", tmp_path, Bounds(1, 1), Bounds(1, 1))
    assert isinstance(default, SQLiteStore) and default.path == tmp_path / "state.db" and not default.durable
    assert _without_password("redis://user:hunter2@host:6379/0") == "redis://user:***@host:6379/0"


def test_closing_a_store_never_opened_touches_nothing(tmp_path):
    """A worker that never used its store (or one with a corrupt file) closes it without opening it."""
    async def go():
        path = tmp_path / "state.db"
        path.write_bytes(b"corrupt" * 100)
        store = SQLiteStore(path, Bounds(10, 3600), Bounds(10, 3600), durable=True)
        await store.close()  # no StoreUnavailable from a needless open
        unused = SQLiteStore(tmp_path / "unused.db", Bounds(10, 3600), Bounds(10, 3600), durable=True)
        await unused.close()
        assert not (tmp_path / "unused.db").exists()
    run(go())


def test_a_conversation_body_is_bounded_naming_the_field():
    """OpenAI's bounds: 16 metadata pairs, keys up to 64 characters, values up to 512, 20 items a call."""
    import json

    from rill.asgi.errors import APIError
    from rill.asgi.routes.conversations import _decode

    message = {"type": "message", "role": "user", "content": "hi"}
    for body, param in [({"metadata": {str(i): "v" for i in range(17)}}, "metadata"),
                        ({"metadata": {"k" * 65: "v"}}, "metadata"), ({"metadata": {"k": "v" * 513}}, "metadata"),
                        ({"items": [message] * 21}, "items"), ({"items": [{**message, "id": "x"}]}, "items[0].id")]:
        with pytest.raises(APIError) as err:
            _decode(json.dumps(body).encode())
        assert (err.value.status, err.value.param) == (400, param), err.value.message
    ok = _decode(json.dumps({"metadata": {"k" * 64: "v" * 512}, "items": [{**message, "junk": 1}] * 20}).encode())
    assert len(ok.items) == 20 and "junk" not in ok.items[0]


def test_workers_that_open_a_new_file_together_all_get_it(tmp_path):
    """API workers start together: the first store call of each opens the file (WAL, schema) at the same moment, and
    none may find it locked (an ERROR in the log, and that call's 503)."""
    import threading

    from rill.asgi.stores.base import StoreUnavailable
    failed = []

    def first_call(store: SQLiteStore, barrier: threading.Barrier) -> None:
        barrier.wait()
        try:
            store.call(lambda conn: conn.execute("SELECT COUNT(*) FROM responses").fetchall())
        except StoreUnavailable as exc:
            failed.append(exc)

    for i in range(40):
        stores = [SQLiteStore(tmp_path / f"state{i}.db", ROOMY, ROOMY, durable=False) for _ in range(4)]
        barrier = threading.Barrier(len(stores))
        threads = [threading.Thread(target=first_call, args=(store, barrier)) for store in stores]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for store in stores:
            store._close()
    assert failed == []
