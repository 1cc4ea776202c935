"""The Batch API's records in the state store, SQLite and a real redis-server alike: a file count
that holds, pages by `after`, a status changed only by compare-and-set, and a lease that one
owner alone holds until it lets go or it expires."""
from __future__ import annotations

import asyncio
import time

import pytest

from rill.asgi.batch.records import Batch, FileObject, Status, new_batch_id, new_file_id
from rill.asgi.stores.base import Bounds
from rill.asgi.stores.open_batches import batch_store_for


@pytest.fixture(params=["sqlite", "redis"])
def make_store(request, tmp_path):
    from rill.asgi.stores.redis_store import RedisStore
    from rill.asgi.stores.sqlite_store import SQLiteStore

    bounds = Bounds(100, 3600.0)
    if request.param == "redis":
        redis = request.getfixturevalue("redis_server")
        redis.command("FLUSHALL")
        return lambda: RedisStore(redis.url, bounds, bounds)
    return lambda: SQLiteStore(tmp_path / "state.db", bounds, bounds, durable=True)


def run(make_store, body):
    async def go():
        store = make_store()
        try:
            return await body(batch_store_for(store))
        finally:
            await store.close()
    return asyncio.run(go())


def a_file(purpose: str = "batch") -> FileObject:
    return FileObject(id=new_file_id(), bytes=3, created_at=int(time.time()), filename="x.jsonl", purpose=purpose,
                      object="file", status="processed")


def a_batch(status: Status = Status.VALIDATING) -> Batch:
    return Batch(id=new_batch_id(), object="batch", endpoint="/v1/chat/completions", input_file_id=new_file_id(),
                 completion_window="24h", status=status.value, created_at=1, expires_at=2)


def test_files_are_counted_listed_and_deleted(make_store):
    async def body(batches):
        made = [a_file() for _ in range(3)]
        for f in made:
            assert await batches.add_file(f, max_files=3)
        assert not await batches.add_file(a_file(), max_files=3)  # refused, nothing evicted
        output = a_file("batch_output")
        assert await batches.add_file(output, max_files=None)  # a batch's results always go in
        assert (await batches.get_file(made[0].id)) == made[0]
        ids, more = await batches.list_files(None, 2, "asc", None)
        assert [f.id for f in ids] == [made[0].id, made[1].id] and more
        ids, more = await batches.list_files(None, 10, "asc", made[1].id)
        assert [f.id for f in ids] == [made[2].id, output.id] and not more
        ids, _ = await batches.list_files(None, 10, "desc", None)
        assert ids[0].id == output.id
        assert [f.id for f in (await batches.list_files("batch_output", 10, "desc", None))[0]] == [output.id]
        assert await batches.list_files(None, 10, "asc", a_file().id) is None  # `after` unknown
        assert await batches.list_files(None, 10, "asc", "../etc") is None
        assert await batches.delete_file(made[0].id) and not await batches.delete_file(made[0].id)
        assert await batches.get_file(made[0].id) is None and await batches.get_file("file-../../x") is None
        assert await batches.add_file(a_file(), max_files=4)  # room again
    run(make_store, body)


def test_batches_page_newest_first_and_evict_only_finished_ones(make_store):
    async def body(batches):
        old = [a_batch() for _ in range(3)]
        for b in old:
            assert await batches.add_batch(b, max_batches=3)
        assert not await batches.add_batch(a_batch(), max_batches=3)  # none finished: refused
        done = Batch(**{**{f: getattr(old[1], f) for f in old[1].__struct_fields__}, "status": "completed"})
        assert await batches.update_batch(done, ("validating",))
        newest = a_batch()
        assert await batches.add_batch(newest, max_batches=3)  # old[1], finished, went
        assert await batches.get_batch(old[1].id) is None
        page, more = await batches.list_batches(2, None)
        assert [b.id for b in page] == [newest.id, old[2].id] and more
        page, more = await batches.list_batches(2, old[2].id)
        assert [b.id for b in page] == [old[0].id] and not more
        assert await batches.list_batches(2, new_batch_id()) is None
    run(make_store, body)


def test_status_changes_by_compare_and_set(make_store):
    async def body(batches):
        batch = a_batch(Status.IN_PROGRESS)
        await batches.add_batch(batch, 10)
        batch.move_to(Status.CANCELLING)
        assert await batches.update_batch(batch, ("validating", "in_progress"))
        stale = a_batch(Status.IN_PROGRESS)
        stale.id = batch.id
        stale.request_counts.completed = 5
        assert not await batches.update_batch(stale, ("in_progress",))  # a runner's late write loses
        assert (await batches.get_batch(batch.id)).status == "cancelling"
        assert not await batches.update_batch(a_batch(), ("validating",))  # no such batch
    run(make_store, body)


def test_one_owner_holds_a_lease(make_store):
    async def body(batches):
        first, second, finished = a_batch(), a_batch(), a_batch(Status.COMPLETED)
        for b in (finished, first, second):
            await batches.add_batch(b, 10)
        assert await batches.claim_batch("w1", 30.0) == first.id  # the oldest active one
        assert await batches.claim_batch("w2", 30.0) == second.id
        assert await batches.claim_batch("w3", 30.0) is None  # both held; a finished one is never claimed
        assert await batches.renew_lease(first.id, "w1", 30.0)
        assert not await batches.renew_lease(first.id, "w2", 30.0)
        await batches.release_lease(first.id, "w2")  # not its lease: nothing happens
        assert await batches.claim_batch("w3", 30.0) is None
        await batches.release_lease(first.id, "w1")
        assert await batches.claim_batch("w3", 0.2) == first.id
        await asyncio.sleep(0.4)  # w3 died: its lease expires
        assert not await batches.renew_lease(first.id, "w3", 30.0)
        assert await batches.claim_batch("w4", 30.0) == first.id
    run(make_store, body)
