"""How many batch lines may run now: batch work goes below interactive requests, never before them.

Rill has no priority scheduling in the engine yet, so the runner paces itself from the engine's
own queue (EngineStats, asked each time, so it is fresh whatever this worker has in flight):
- a request waits in the engine: no new batch line (the interactive one gets the next free slot);
- requests other than this runner's are running: one batch line at a time, so a batch adds
  little to each interactive step (docs/batch.md has the measured ITL ratio);
- the engine is otherwise idle: up to --batch-concurrency lines.
"""
from __future__ import annotations

from rill.asgi.engine_link.client import EngineDead

STATS_TIMEOUT_S = 2.0
SHARED_LINES = 1  # lines in flight while interactive requests run


class Pacer:
    def __init__(self, client, concurrency: int):
        self.client = client
        self.concurrency = concurrency

    async def allowed(self, in_flight: int) -> int:
        """The lines this runner may have in flight now (it has `in_flight`)."""
        try:
            stats = await self.client.stats(STATS_TIMEOUT_S)
        except (EngineDead, TimeoutError):
            return 0
        return allowed_lines(stats.num_running, stats.num_waiting, in_flight, self.concurrency)


def allowed_lines(num_running: int, num_waiting: int, in_flight: int, concurrency: int) -> int:
    if num_waiting > 0:
        return 0
    others = num_running - in_flight  # this runner's lines that are not yet reported count as others
    return min(concurrency, SHARED_LINES) if others > 0 else concurrency
