"""A batch worked through by BatchJob against a real SQLite store and real files, with the route
call and the pacing replaced at the edge: lines the server could not take (429, 503, an abort)
run again, and a batch past its deadline expires its lines not run."""
from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace

from rill.asgi.batch.file_disk import FileDisk
from rill.asgi.batch.job import BatchJob
from rill.asgi.batch.line_call import Answer
from rill.asgi.batch.records import Batch, FileObject, RequestCounts, Status, new_batch_id, new_file_id
from rill.asgi.stores.base import Bounds
from rill.asgi.stores.open_batches import batch_store_for
from rill.asgi.stores.sqlite_store import SQLiteStore

URL = "/v1/chat/completions"


class Caller:
    """Answers each line by its custom id's script: the next status of the list, 200 once it is empty."""

    def __init__(self, script: dict[str, list[int | None]]):
        self.script = script
        self.calls: list[str] = []

    async def call(self, url: str, body: bytes, abort: asyncio.Event) -> Answer | None:
        custom_id = json.loads(body)["tag"]
        self.calls.append(custom_id)
        queue = self.script.get(custom_id)
        status = queue.pop(0) if queue else 200
        if status is None:
            return None
        return Answer(status, "req_1", json.dumps({"tag": custom_id, "usage": {"prompt_tokens": 2,
                                                                               "completion_tokens": 3}}).encode())


class Pacer:
    async def allowed(self, in_flight: int) -> int:
        return 2


def work(tmp_path, script, *, num_lines=4, expires_in_s=3600.0):
    async def go():
        store = SQLiteStore(tmp_path / "state.db", Bounds(10, 3600.0), Bounds(10, 3600.0), durable=True)
        batches, disk = batch_store_for(store), FileDisk(tmp_path / "files")
        source = new_file_id()
        disk.write(source, "".join(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": URL, "body": {
            "model": "m", "tag": f"c{i}"}}) + "\n" for i in range(num_lines)).encode())
        await batches.add_file(FileObject(id=source, bytes=1, created_at=1, filename="in", purpose="batch",
                                          object="file", status="processed"), None)
        batch = Batch(id=new_batch_id(), object="batch", endpoint=URL, input_file_id=source, completion_window="24h",
                      status=Status.VALIDATING.value, created_at=int(time.time()),
                      expires_at=int(time.time() + expires_in_s), request_counts=RequestCounts(total=num_lines))
        await batches.add_batch(batch, 10)
        state = SimpleNamespace(batches=batches, files=disk,
                                settings=SimpleNamespace(http=SimpleNamespace(batch_max_lines=100)))
        caller = Caller(script)

        async def keep_going() -> bool:
            return True

        await BatchJob(state, batch, caller, Pacer(), keep_going).run()
        done = await batches.get_batch(batch.id)
        files = {kind: [json.loads(raw) for raw in disk.read(getattr(done, f"{kind}_file_id")).splitlines()]
                 for kind in ("output", "error") if getattr(done, f"{kind}_file_id")}
        await store.close()
        return done, files, caller.calls
    return asyncio.run(go())


def test_lines_the_server_could_not_take_run_again(tmp_path):
    done, files, calls = work(tmp_path, {"c1": [429, 503], "c2": [None], "c3": [400]})
    assert done.status == "completed" and (done.request_counts.completed, done.request_counts.failed) == (3, 1)
    assert sorted(r["custom_id"] for r in files["output"]) == ["c0", "c1", "c2"]
    assert [(r["custom_id"], r["response"]["status_code"]) for r in files["error"]] == [("c3", 400)]
    assert sorted(calls) == ["c0", "c1", "c1", "c1", "c2", "c2", "c3"]
    assert done.usage["input_tokens"] == 8 and done.usage["output_tokens"] == 12  # the 4 answers written
    assert done.in_progress_at and done.finalizing_at and done.completed_at


def test_a_batch_past_its_deadline_expires_its_lines(tmp_path):
    done, files, calls = work(tmp_path, {}, num_lines=3, expires_in_s=-1)
    assert done.status == "expired" and done.expired_at and calls == []
    assert done.request_counts.failed == 3 and "output" not in files
    assert {r["custom_id"] for r in files["error"]} == {"c0", "c1", "c2"}
    assert all(r["error"]["code"] == "batch_expired" and r["response"] is None for r in files["error"])
