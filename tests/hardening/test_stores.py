"""Hardening: the state store is bounded in bytes, keeps only the fields the API defines, pages
its lists in the database, and no id can name a key it was not minted for.

The store objects are driven directly against SQLite and a real redis-server (the same cases for
both); a few requests go to the session's `tiny_server`, whose store is the default SQLite one.
"""
from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers.server import TINY_MODEL

JUNK = "JUNK-FIELD-5c1d"  # in no field the API defines: must not be stored


def run(coro):
    return asyncio.run(coro)


def _bounds(max_entries=100, ttl_s=3600.0, **more):
    from rill.asgi.stores.base import Bounds

    return Bounds(max_entries, ttl_s, **more)


class Backend:
    """One store kind, and what it holds underneath (read around the store)."""

    def __init__(self, kind: str, tmp_path: Path, request):
        self.kind, self.tmp_path = kind, tmp_path
        if kind == "redis":
            self.redis = request.getfixturevalue("redis_server")
            self.redis.command("FLUSHALL")

    def store(self, responses=None, conversations=None):
        from rill.asgi.stores.redis_store import RedisStore
        from rill.asgi.stores.sqlite_store import SQLiteStore

        responses, conversations = responses or _bounds(), conversations or _bounds()
        if self.kind == "sqlite":
            return SQLiteStore(self.tmp_path / "state.db", responses, conversations, durable=True)
        return RedisStore(self.redis.url, responses, conversations)

    def raw_bytes(self) -> bytes:
        """Everything the store holds, as bytes."""
        if self.kind == "sqlite":
            return b"".join(p.read_bytes() for p in self.tmp_path.iterdir())
        keys = [k.decode() for k in self.redis.command("KEYS", "*").split(b"\r\n") if k and k[:1] not in b"*$"]
        read = {b"+string": ("GET",), b"+list": ("LRANGE", "0", "-1"), b"+hash": ("HGETALL",),
                b"+zset": ("ZRANGE", "0", "-1")}
        return b"".join(self.redis.command(read[self.redis.command("TYPE", k).strip()][0], k,
                                           *read[self.redis.command("TYPE", k).strip()][1:]) for k in keys)

    def corrupt_first_item(self, owner_id: str) -> None:
        """The oldest item of a list stops being JSON: reading it would fail."""
        if self.kind == "sqlite":
            table, owner = ("conversation_items", "conversation_id") if owner_id.startswith("conv_") else \
                ("response_items", "response_id")
            with sqlite3.connect(self.tmp_path / "state.db") as conn:
                conn.execute(f"UPDATE {table} SET body = x'00ff' WHERE seq = (SELECT MIN(seq) FROM {table} "
                             f"WHERE {owner} = ?)", (owner_id,))
        else:
            kind = "conv" if owner_id.startswith("conv_") else "resp"
            assert self.redis.command("LSET", f"rill:{kind}-items:{owner_id}", "0", "\x00\xff").startswith(b"+OK")


@pytest.fixture(params=["sqlite", "redis"])
def backend(request, tmp_path):
    return Backend(request.param, tmp_path, request)


def message(i: int, text: str = "hi", **extra) -> dict:
    return {"id": f"msg_{i}", "type": "message", "role": "user", "status": "completed",
            "content": [{"type": "input_text", "text": text}], **extra}


def record(i: int, items: list[dict] | None = None, text: str = "hello"):
    from rill.asgi.stores.base import StoredResponse

    return StoredResponse(id=f"resp_{i}", response={"id": f"resp_{i}", "status": "completed", "text": text},
                          input_items=items if items is not None else [message(i)],
                          messages=[{"role": "user", "content": text}])


def conversation(i: int):
    from rill.asgi.stores.base import Conversation

    return Conversation(id=f"conv_{i}", created_at=1, metadata={})


# ---- the stores ------------------------------------------------------------------------------

def test_only_the_fields_the_api_defines_are_stored(backend):
    junky = {**message(1), "junk": JUNK, "content": [{"type": "input_text", "text": "hi", "junk": JUNK}]}
    answer = {"id": "msg_2", "type": "message", "role": "assistant", "status": "completed", "junk": JUNK,
              "content": [{"type": "output_text", "text": "ok", "annotations": [], "junk": JUNK,
                           "logprobs": [{"token": "ok", "logprob": -0.5, "bytes": [111, 107], "top_logprobs": [],
                                         "junk": JUNK}]}]}
    call = {"id": "fc_3", "type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}", "junk": JUNK}

    async def go():
        store = backend.store()
        await store.put_conversation(conversation(1), [junky])
        await store.add_items("conv_1", [answer, call])
        await store.put_response(record(1, [junky, call]))
        items = (await store.page_items("conv_1", 10, "asc", None)).items
        assert items[0] == message(1) and items[2] == {k: v for k, v in call.items() if k != "junk"}
        assert items[1]["content"][0] == {"type": "output_text", "text": "ok", "annotations": [], "logprobs": [
            {"token": "ok", "logprob": -0.5, "bytes": [111, 107], "top_logprobs": []}]}
        assert (await store.page_response_items("resp_1", 10, "asc", None)).items[0] == message(1)
        await store.close()
    run(go())
    assert JUNK.encode() not in backend.raw_bytes()


def test_an_item_of_another_shape_is_refused_naming_it(backend):
    from rill.asgi.stores.items import Refused

    async def go():
        store = backend.store()
        for bad, param in [({**message(1), "id": "x:items"}, "items[0].id"),
                           ({**message(1), "content": [{"type": "input_text", "text": {"deep": [1]}}]},
                            "items[0].content[0].text"),
                           ({**message(1), "role": "tool"}, "items[0].role")]:
            with pytest.raises(Refused) as err:
                await store.put_conversation(conversation(1), [bad])
            assert err.value.status == 400 and err.value.param == param
        assert await store.get_conversation("conv_1") is None
        await store.close()
    run(go())


def test_one_entry_and_one_item_are_bounded_in_bytes(backend):
    from rill.asgi.stores.base import MAX_ITEM_BYTES
    from rill.asgi.stores.items import Refused

    async def go():
        store = backend.store(responses=_bounds(max_entry_bytes=20_000))
        with pytest.raises(Refused) as err:
            await store.put_conversation(conversation(1), [message(1), message(2, "x" * MAX_ITEM_BYTES)])
        assert err.value.param == "items[1]"
        big = record(1, [message(1, "x" * 30_000)])
        big.response["status"] = "in_progress"
        with pytest.raises(Refused) as err:  # the first write, before any work: the client is told
            await store.put_response(big)
        assert err.value.param == "input" and await store.get_response("resp_1") is None
        await store.put_response(record(2))
        await store.put_response(record(2, text="y" * 30_000))  # finished, grown past it: evicted
        assert await store.get_response("resp_2") is None
        await store.close()
    run(go())


def test_a_conversation_is_bounded_in_items_and_bytes(backend):
    from rill.asgi.stores.base import MAX_CONVERSATION_ITEMS
    from rill.asgi.stores.items import Refused

    async def go():
        store = backend.store(conversations=_bounds(max_entry_bytes=200_000))
        await store.put_conversation(conversation(1), [])
        await store.put_conversation(conversation(2), [message(1, "x" * 90_000)])
        assert await store.add_items("conv_2", [message(2, "x" * 90_000)])
        with pytest.raises(Refused) as err:
            await store.add_items("conv_2", [message(3, "x" * 90_000)])
        assert (err.value.param, err.value.code) == ("items", "conversation_full")
        assert len((await store.page_items("conv_2", 100, "asc", None)).items) == 2  # nothing half-added
        many = [message(i, "") for i in range(20)]
        for _ in range(MAX_CONVERSATION_ITEMS // 20):
            assert await store.add_items("conv_1", many)
        with pytest.raises(Refused) as err:
            await store.add_items("conv_1", [message(0)])
        assert err.value.code == "conversation_full"
        await store.delete_item("conv_1", "msg_0")  # room for one again
        assert await store.add_items("conv_1", [message(0)])
        await store.close()
    run(go())


def test_the_total_bytes_evict_the_oldest(backend):
    async def go():
        store = backend.store(responses=_bounds(max_bytes=40_000, max_entry_bytes=15_000),
                              conversations=_bounds(max_bytes=40_000, max_entry_bytes=30_000))
        for i in range(10):
            await store.put_response(record(i, [message(i, "r" * 9_000)]))
        kept = [await store.get_response(f"resp_{i}") is not None for i in range(10)]
        assert kept == [False] * 6 + [True] * 4
        for i in range(3):
            await store.put_conversation(conversation(i), [message(i, "c" * 9_000)])
        # The oldest conversation grows: the others go to make room, never the one written.
        assert await store.add_items("conv_0", [message(9, "c" * 9_000), message(8, "c" * 9_000)])
        assert [await store.get_conversation(f"conv_{i}") is not None for i in range(3)] == [True, False, True]
        await store.close()
    run(go())


def test_lists_read_one_page_from_the_database(backend):
    """The first item is not JSON any more: a page that does not hold it reads fine, so the
    store never read the whole list; paging itself is OpenAI's (order, after, has_more)."""
    from rill.asgi.stores.items import Refused

    async def go():
        store = backend.store()
        await store.put_conversation(conversation(1), [message(i) for i in range(20)])
        assert await store.add_items("conv_1", [message(i) for i in range(20, 30)])
        await store.put_response(record(1, [message(i) for i in range(30)]))
        backend.corrupt_first_item("conv_1")
        backend.corrupt_first_item("resp_1")
        for read in (store.page_items, store.page_response_items):
            owner = "conv_1" if read == store.page_items else "resp_1"
            page = await read(owner, 2, "desc", None)
            assert [i["id"] for i in page.items] == ["msg_29", "msg_28"] and page.has_more
            page = await read(owner, 3, "asc", "msg_26")
            assert [i["id"] for i in page.items] == ["msg_27", "msg_28", "msg_29"] and not page.has_more
            page = await read(owner, 2, "desc", "msg_3")
            assert [i["id"] for i in page.items] == ["msg_2", "msg_1"] and page.has_more
            assert (await read(owner, 5, "asc", "msg_29")).items == []
            for after in ("msg_99", "index", "x:items"):
                with pytest.raises(Refused) as err:
                    await read(owner, 2, "asc", after)
                assert err.value.param == "after"
        assert await store.get_item("conv_1", "msg_5") == message(5)
        assert await store.page_items("conv_9", 2, "asc", None) is None
        assert await store.page_response_items("resp_9", 2, "asc", None) is None
        await store.close()
    run(go())


def test_no_id_reaches_a_key_it_was_not_minted_for(backend):
    """`index` (the Redis count index, once), ids with a colon or of another kind: not found,
    and never written; the count bound still holds after them."""
    async def go():
        store = backend.store(conversations=_bounds(max_entries=2))
        await store.put_conversation(conversation(1), [message(1)])
        await store.put_conversation(conversation(2), [message(2)])
        for bad in ("index", "conv_1:items", "resp_1", "conv_*", "conv_1\n"):
            assert await store.delete_conversation(bad) is False
            assert await store.get_conversation(bad) is None and await store.add_items(bad, [message(3)]) is False
            assert await store.page_items(bad, 2, "asc", None) is None
            assert await store.delete_item("conv_1", bad) is False
        for bad in ("index", "resp_x:items", "conv_1"):
            assert await store.get_response(bad) is None and await store.delete_response(bad) is False
            with pytest.raises(ValueError):
                await store.put_response(record(1).__class__(id=bad, response={}, input_items=[], messages=[]))
        time.sleep(0.01)
        await store.put_conversation(conversation(3), [message(3)])
        assert [await store.get_conversation(f"conv_{i}") is not None for i in (1, 2, 3)] == [False, True, True]
        await store.close()
    run(go())


OLD_SCHEMA = """
CREATE TABLE responses (id TEXT PRIMARY KEY, stored_at REAL NOT NULL, body BLOB NOT NULL);
CREATE INDEX responses_by_age ON responses (stored_at);
CREATE TABLE conversations (id TEXT PRIMARY KEY, stored_at REAL NOT NULL, body BLOB NOT NULL);
CREATE INDEX conversations_by_age ON conversations (stored_at);
CREATE TABLE conversation_items (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, conversation_id TEXT NOT NULL, item_id TEXT NOT NULL, body BLOB NOT NULL);
CREATE INDEX items_by_conversation ON conversation_items (conversation_id, seq);
"""


def test_a_durable_file_of_the_older_schema_is_upgraded(tmp_path):
    """A file written before the bounds in bytes (items inside a response's record, no sizes)
    keeps what it held, and its lists page."""
    import msgspec

    from rill.asgi.stores.sqlite_store import SQLiteStore

    path = tmp_path / "state.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(OLD_SCHEMA)
        conn.execute("INSERT INTO responses VALUES (?, ?, ?)", ("resp_1", time.time(), msgspec.json.encode(
            {"id": "resp_1", "response": {"id": "resp_1"}, "input_items": [message(1), message(2)],
             "messages": []})))
        conn.execute("INSERT INTO conversations VALUES (?, ?, ?)", ("conv_1", time.time(), msgspec.json.encode(
            {"id": "conv_1", "created_at": 1, "metadata": {}})))
        conn.execute("INSERT INTO conversation_items (conversation_id, item_id, body) VALUES (?, ?, ?)",
                     ("conv_1", "msg_1", msgspec.json.encode(message(1))))

    async def go():
        store = SQLiteStore(path, _bounds(), _bounds(max_entry_bytes=2_000), durable=True)
        assert (await store.get_response("resp_1")).response == {"id": "resp_1"}
        assert [i["id"] for i in (await store.page_response_items("resp_1", 1, "asc", None)).items] == ["msg_1"]
        assert [i["id"] for i in (await store.page_items("conv_1", 5, "desc", None)).items] == ["msg_1"]
        with pytest.raises(Exception, match="conversation holds at most"):  # its size was counted
            await store.add_items("conv_1", [message(2, "x" * 1_900)])
        await store.close()
    run(go())


# ---- over HTTP (the session's tiny server, default SQLite store) -----------------------------

def post(srv, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{srv.base_url}{path}", json=body, timeout=60)


def test_conversation_items_keep_only_defined_fields(tiny_server):
    junky = {"type": "message", "role": "user", "junk": JUNK, "content": [{"type": "input_text", "text": "hi",
                                                                         "junk": JUNK}]}
    r = post(tiny_server, "/v1/conversations", {"items": [junky], "metadata": {"k": "v"}})
    assert r.status_code == 200, r.text
    conv_id = r.json()["id"]
    added = post(tiny_server, f"/v1/conversations/{conv_id}/items", {"items": [junky]})
    assert added.status_code == 200 and JUNK not in added.text, added.text
    listed = httpx.get(f"{tiny_server.base_url}/v1/conversations/{conv_id}/items?limit=1", timeout=30)
    assert listed.status_code == 200 and JUNK not in listed.text, listed.text
    assert listed.json()["has_more"] is True and len(listed.json()["data"]) == 1


def test_an_item_id_of_another_shape_or_over_a_mebibyte_is_a_400(tiny_server):
    for item, param in [({"type": "message", "role": "user", "content": "hi", "id": "x:items"}, "items[0].id"),
                        ({"type": "message", "role": "user", "content": "x" * (1 << 20)}, "items[0]")]:
        r = post(tiny_server, "/v1/conversations", {"items": [item]})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_response_input_items_keep_only_defined_fields(tiny_server):
    r = post(tiny_server, "/v1/responses", {"model": TINY_MODEL, "max_output_tokens": 1, "input": [
        {"type": "message", "role": "user", "junk": JUNK, "content": [{"type": "input_text", "text": "hi",
                                                                       "junk": JUNK}]}]})
    assert r.status_code == 200, r.text
    listed = httpx.get(f"{tiny_server.base_url}/v1/responses/{r.json()['id']}/input_items", timeout=30)
    assert listed.status_code == 200 and JUNK not in listed.text, listed.text
    assert listed.json()["data"][0]["content"] == [{"type": "input_text", "text": "hi"}]


def test_a_full_conversation_refuses_more_and_a_turn_before_any_work(tiny_server):
    MAX_CONVERSATION_ITEMS = 1000  # asgi/stores/base.py's, written out: the test reads on its own
    conv_id = post(tiny_server, "/v1/conversations", {}).json()["id"]
    twenty = {"items": [{"type": "message", "role": "user", "content": ""}] * 20}
    with httpx.Client(base_url=tiny_server.base_url, timeout=30) as client:
        for _ in range(MAX_CONVERSATION_ITEMS // 20):
            assert client.post(f"/v1/conversations/{conv_id}/items", json=twenty).status_code == 200
        r = client.post(f"/v1/conversations/{conv_id}/items", json={"items": twenty["items"][:1]})
        assert r.status_code == 400 and r.json()["error"]["code"] == "conversation_full", r.text
        r = client.post("/v1/responses", json={"model": TINY_MODEL, "max_output_tokens": 1, "input": "hi",
                                               "conversation": conv_id})
        assert r.status_code == 400 and r.json()["error"]["param"] == "conversation", r.text
