"""The batch runner each API worker runs: claims a batch through the store, works it, lets it go.

A claim is a lease in the store (asgi/stores/batch_store.py), renewed as the work goes on, so one
worker alone runs a given batch, across the workers of a server and the servers sharing a Redis
store. A worker that dies without letting go leaves the lease to expire (LEASE_S), and another
worker (or the same server after a restart) resumes the batch from the lines written. A server
that stops lets go at once: the lines in flight are aborted and run again on resume.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid

from rill.asgi.batch.job import BatchJob, Stop
from rill.asgi.batch.line_call import LineCaller
from rill.asgi.batch.pacing import Pacer
from rill.asgi.stores.base import StoreUnavailable

log = logging.getLogger("rill.batch")

LEASE_S = 30.0  # a dead worker's batch waits this long for another worker
CLAIM_EVERY_S = 0.5  # how often an idle runner looks for a batch to run (a read, unless one is free)
RETRY_AFTER_S = 5.0  # after a failure of the store or of a job, doubled while they go on
MAX_RETRY_AFTER_S = 300.0  # a store that stays down is logged by every worker this often at most


class BatchRunner:
    def __init__(self, state, handler_for):
        self.state = state
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.caller = LineCaller(state, handler_for)
        self.pacer = Pacer(state.client, state.settings.http.batch_concurrency)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """--batch-concurrency 0: this server runs no batch (another one sharing the store may)."""
        if self.state.settings.http.batch_concurrency > 0:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _loop(self) -> None:
        batches = self.state.batches
        failures = 0
        while not self.state.draining():
            try:
                batch_id = await batches.claim_batch(self.owner, LEASE_S)
            except StoreUnavailable:
                failures += 1
                await asyncio.sleep(min(RETRY_AFTER_S * 2 ** (failures - 1), MAX_RETRY_AFTER_S))
                continue
            failures = 0
            if batch_id is None:
                await asyncio.sleep(CLAIM_EVERY_S)
                continue
            try:
                await self._run(batch_id)
            except Stop:
                log.info("batch %s let go (lease lost or server stopping)", batch_id)
            except StoreUnavailable:
                await asyncio.sleep(RETRY_AFTER_S)
            except Exception:
                log.exception("batch %s failed in the runner; it will be resumed", batch_id)
                await asyncio.sleep(RETRY_AFTER_S)
            finally:
                try:
                    await batches.release_lease(batch_id, self.owner)
                except StoreUnavailable:
                    pass  # it expires on its own

    async def _run(self, batch_id: str) -> None:
        batch = await self.state.batches.get_batch(batch_id)
        if batch is None:
            return
        log.info("batch %s claimed (%s)", batch_id, batch.status)

        async def keep_going() -> bool:
            if self.state.draining():
                return False
            return await self.state.batches.renew_lease(batch_id, self.owner, LEASE_S)

        await BatchJob(self.state, batch, self.caller, self.pacer, keep_going).run()
