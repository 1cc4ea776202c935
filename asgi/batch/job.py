"""One batch worked through by the runner that holds its lease: lines in, output and error files out.

States: validating -> in_progress -> finalizing -> completed; in_progress -> expired at the
deadline (the lines not run go to the error file as `batch_expired`); validating or in_progress
-> cancelling (a client) -> cancelled (lines in flight aborted, what was written kept). Each line's
result is appended to a work file before it counts, so a batch resumed after a restart runs only
the lines not written (asgi/batch/file_disk.py); `request_counts` are recounted from those files.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from typing import Any

import msgspec

from rill.asgi.batch.file_disk import LineWriter
from rill.asgi.batch.jsonl import Line, parse_lines
from rill.asgi.batch.line_call import Answer, LineCaller
from rill.asgi.batch.pacing import Pacer
from rill.asgi.batch.records import (
    Batch,
    FileObject,
    Purpose,
    RequestCounts,
    Status,
    batch_errors,
    new_batch_request_id,
    now,
)

log = logging.getLogger("rill.batch")

POLL_S = 0.1  # how often the pacing is asked again while lines run or wait
RETRY_AFTER_S = 1.0  # after a line the server could not take now (429, 503): it is run again later
TRANSIENT = (429, 503)  # a full queue, the engine or the store down, the server stopping
SYNC_S = 1.0  # how often request_counts are written and a cancel or a lost lease is noticed
_custom_id = msgspec.json.Decoder(dict[str, Any])
_encode = msgspec.json.Encoder().encode


class Stop(Exception):
    """The job lets go of its batch without finishing it (lease lost, server stopping)."""


def result_file_id(batch_id: str, kind: str) -> str:
    """A batch's output or error file id, derived from its id: finishing twice (a restart in the
    middle of finishing) names the same file."""
    return f"file-{hashlib.sha256(f'{batch_id}:{kind}'.encode()).hexdigest()[:32]}"


class BatchJob:
    def __init__(self, state, batch: Batch, caller: LineCaller, pacer: Pacer, keep_going):
        self.state, self.batch, self.caller, self.pacer = state, batch, caller, pacer
        self.keep_going = keep_going  # async () -> bool: the lease is still ours and the server not stopping
        disk = state.files
        self.disk = disk
        self.output = LineWriter(disk.work_path(batch.id, "output"))
        self.errors = LineWriter(disk.work_path(batch.id, "errors"))
        self.usage = {"input_tokens": 0, "cached_tokens": 0, "output_tokens": 0}

    async def run(self) -> None:
        try:
            while True:
                status = self.batch.status
                if status == Status.VALIDATING.value:
                    await self._start()
                elif status == Status.IN_PROGRESS.value:
                    await self._work()
                elif status == Status.CANCELLING.value:
                    await self._finish(Status.CANCELLED)
                elif status == Status.FINALIZING.value:
                    await self._finish(Status.COMPLETED)
                else:
                    return
        finally:
            self.output.close()
            self.errors.close()

    async def _move(self, status: Status, **fields) -> None:
        """Compare-and-set from the status read; on a race (a client's cancel) the stored batch is read back."""
        seen = self.batch.status
        updated = msgspec.structs.replace(self.batch, **fields)
        updated.move_to(status)
        if await self.state.batches.update_batch(updated, (seen,)):
            self.batch = updated
        else:
            await self._reload()

    async def _reload(self) -> None:
        got = await self.state.batches.get_batch(self.batch.id)
        if got is None:
            raise Stop  # deleted under us (evicted): nothing to write to
        self.batch = got

    async def _lines(self) -> list[Line] | None:
        try:
            data = await asyncio.to_thread(self.disk.read, self.batch.input_file_id)
        except FileNotFoundError:
            await self._move(Status.FAILED, errors=batch_errors([{
                "code": "file_not_found", "message": f"The input file {self.batch.input_file_id} was deleted.",
                "param": "input_file_id", "line": None}]))
            return None
        lines, errors = await asyncio.to_thread(parse_lines, data, self.batch.endpoint,
                                                self.state.settings.http.batch_max_lines)
        if errors:  # checked at create: a file changed on disk since
            await self._move(Status.FAILED, errors=batch_errors(errors))
            return None
        return lines

    async def _start(self) -> None:
        if await self._lines() is not None:
            await self._move(Status.IN_PROGRESS)

    def _done_ids(self) -> set[str]:
        """The lines written so far (counts and usage recounted from them)."""
        done = set()
        self.usage = {"input_tokens": 0, "cached_tokens": 0, "output_tokens": 0}
        for kind, writer in (("output", self.output), ("errors", self.errors)):
            final = self.disk.path(result_file_id(self.batch.id, kind))
            if not writer.path.exists() and final.exists():  # adopted before a restart
                lines = final.read_bytes().splitlines()
            else:
                lines = self.disk.whole_lines(self.batch.id, kind)
            writer.num_lines = len(lines)
            for raw in lines:
                record = _custom_id.decode(raw)
                done.add(record["custom_id"])
                self._add_usage(record)
        return done

    def _add_usage(self, record: dict) -> None:
        usage = ((record.get("response") or {}).get("body") or {}).get("usage") or {}
        self.usage["input_tokens"] += usage.get("prompt_tokens", usage.get("input_tokens", 0)) or 0
        self.usage["output_tokens"] += usage.get("completion_tokens", usage.get("output_tokens", 0)) or 0
        details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
        self.usage["cached_tokens"] += details.get("cached_tokens", 0) or 0

    def _counts(self) -> RequestCounts:
        return RequestCounts(self.batch.request_counts.total, self.output.num_lines, self.errors.num_lines)

    async def _work(self) -> None:
        lines = await self._lines()
        if lines is None:
            return
        done = await asyncio.to_thread(self._done_ids)
        self.retry: list[Line] = []  # lines the server could not take now, run again before the rest
        self.hold_until = 0.0
        pending = iter([line for line in lines if line.custom_id not in done])
        abort = asyncio.Event()
        in_flight: dict[asyncio.Task, Line] = {}
        upcoming = next(pending, None)
        next_sync = time.monotonic() + SYNC_S
        outcome: Status | None = None
        unanswered: list[Line] = []
        try:
            while upcoming is not None or in_flight or self.retry:
                if upcoming is not None and time.time() >= self.batch.expires_at:
                    outcome = Status.EXPIRED
                    break
                if upcoming is None and self.retry:
                    upcoming = self.retry.pop(0)
                waiting = upcoming is not None and time.monotonic() >= self.hold_until
                allowed = await self.pacer.allowed(len(in_flight)) if waiting else 0
                while upcoming is not None and len(in_flight) < allowed:
                    task = asyncio.create_task(self.caller.call(self.batch.endpoint, upcoming.body, abort))
                    in_flight[task] = upcoming
                    upcoming = self.retry.pop(0) if self.retry else next(pending, None)
                if in_flight:
                    finished, _ = await asyncio.wait(in_flight, timeout=POLL_S, return_when=asyncio.FIRST_COMPLETED)
                    for task in finished:
                        self._settle(in_flight.pop(task), task.result())
                else:
                    await asyncio.sleep(POLL_S)
                if time.monotonic() >= next_sync:
                    next_sync = time.monotonic() + SYNC_S
                    if not await self._sync():
                        outcome = Status.CANCELLED
                        break
        finally:
            abort.set()  # lines still in flight: aborted (a cancel, an expiry, a stop)
            if in_flight:
                answers = await asyncio.gather(*in_flight, return_exceptions=True)
                for line, answer in zip(in_flight.values(), answers):
                    if isinstance(answer, Answer) and outcome is not None and answer.status_code not in TRANSIENT:
                        self._record(line, answer)  # finished before the abort reached it
                    else:
                        unanswered.append(line)
            self.output.close()
            self.errors.close()
        if outcome is Status.EXPIRED:
            self._expire([*unanswered, *([upcoming] if upcoming is not None else []), *self.retry, *pending])
            await self._finish(Status.EXPIRED)
        elif outcome is None:
            await self._move(Status.FINALIZING, request_counts=self._counts(), usage=self._usage())

    async def _sync(self) -> bool:
        """Writes the counts; False when the batch is being cancelled. Raises Stop when the lease is lost."""
        if not await self.keep_going():
            raise Stop
        await self._move(Status.IN_PROGRESS, request_counts=self._counts(), usage=self._usage())
        return self.batch.status == Status.IN_PROGRESS.value

    def _settle(self, line: Line, answer: Answer | None) -> None:
        """A line's answer is written; one the server could not give now is run again after a pause."""
        if answer is None or answer.status_code in TRANSIENT:
            self.retry.append(line)
            self.hold_until = time.monotonic() + RETRY_AFTER_S
        else:
            self._record(line, answer)

    def _record(self, line: Line, answer: Answer | None) -> None:
        if answer is None:
            return  # aborted: not written, so a resumed batch runs it again
        try:
            body = msgspec.json.decode(answer.body)
        except msgspec.DecodeError:
            body = answer.body.decode("utf-8", "replace")
        record = {"id": new_batch_request_id(), "custom_id": line.custom_id,
                  "response": {"status_code": answer.status_code, "request_id": answer.request_id, "body": body},
                  "error": None}
        (self.output if 200 <= answer.status_code < 300 else self.errors).append(_encode(record))
        self._add_usage(record)

    def _expire(self, lines: list[Line]) -> None:
        """Lines not run by the deadline go to the error file, as OpenAI writes them."""
        for line in lines:
            self.errors.append(_encode({"id": new_batch_request_id(), "custom_id": line.custom_id, "response": None,
                                        "error": {"code": "batch_expired", "message": "This request could not be "
                                                  "executed before the completion window expired."}}))
        self.errors.close()

    def _usage(self) -> dict:
        i, o = self.usage["input_tokens"], self.usage["output_tokens"]
        return {"input_tokens": i, "input_tokens_details": {"cached_tokens": self.usage["cached_tokens"]}, "output_tokens": o,
                "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": i + o}

    async def _finish(self, final: Status) -> None:
        """The work files become the batch's output and error files, then the final status."""
        fields: dict[str, Any] = {}
        await asyncio.to_thread(self._done_ids)  # the counts as the files hold them
        for kind, name in (("output", "output_file_id"), ("errors", "error_file_id")):
            file_id = await self._adopt(kind)
            if file_id is not None:
                fields[name] = file_id
        self.output.close()
        self.errors.close()
        await self._move(final, request_counts=self._counts(), usage=self._usage(), **fields)
        log.info("batch %s %s: %d completed, %d failed of %d", self.batch.id, self.batch.status,
                 self.output.num_lines, self.errors.num_lines, self.batch.request_counts.total)

    async def _adopt(self, kind: str) -> str | None:
        file_id = result_file_id(self.batch.id, kind)
        work, final = self.disk.work_path(self.batch.id, kind), self.disk.path(file_id)
        if work.exists() and work.stat().st_size:
            size = await asyncio.to_thread(self.disk.adopt, self.batch.id, kind, file_id)
        elif final.exists():
            size = final.stat().st_size  # adopted before a restart
        else:
            return None
        if await self.state.batches.get_file(file_id) is None:
            await self.state.batches.add_file(FileObject(
                id=file_id, bytes=size, created_at=now(), filename=f"{self.batch.id}_{kind.rstrip('s')}.jsonl",
                purpose=Purpose.BATCH_OUTPUT.value, object="file", status="processed"), None)
        return file_id
