"""The state store's back ends as the store tests use them: SQLite (a file) and Redis (a real redis-server)."""
from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

from rill.asgi.stores.base import Bounds
from rill.asgi.stores.redis_store import RedisStore
from rill.asgi.stores.sqlite_store import SQLiteStore


def run(coro):
    return asyncio.run(coro)


ROOMY = Bounds(100, 3600)


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class Backend:
    """One store kind: how to make a store (a second one is another worker), let time pass, and
    count what it holds underneath."""

    def __init__(self, kind: str, tmp_path: Path, request):
        self.kind = kind
        self.clock = Clock()
        self.tmp_path = tmp_path
        if kind == "redis":
            self.redis = request.getfixturevalue("redis_server")
            self.redis.command("FLUSHALL")

    def store(self, responses=ROOMY, conversations=ROOMY):
        if self.kind == "sqlite":
            return SQLiteStore(self.tmp_path / "state.db", responses, conversations, durable=True, clock=self.clock)
        return RedisStore(self.redis.url, responses, conversations)

    def advance(self, seconds: float) -> None:
        if self.kind == "sqlite":
            self.clock.now += seconds
        else:
            time.sleep(seconds)  # Redis keeps its own time

    def count(self, what: str) -> int:
        """Rows or keys that hold responses, conversations or conversation items."""
        if self.kind == "sqlite":
            table = {"responses": "responses", "conversations": "conversations", "items": "conversation_items",
                     "events": "response_events"}[what]
            with sqlite3.connect(self.tmp_path / "state.db") as conn:
                return conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
        if what == "events":
            return sum(int(self.redis.command("LLEN", f"rill:resp-events:{rid}")[1:].split(b"\r")[0])
                       for rid in self._ids("rill:resp-events:*"))
        if what == "items":
            return sum(int(self.redis.command("LLEN", f"rill:conv-items:{cid}")[1:].split(b"\r")[0])
                       for cid in self._ids("rill:conv-items:*"))
        return len(self._ids({"responses": "rill:resp:*", "conversations": "rill:conv:*"}[what]))

    def _ids(self, pattern: str) -> list[str]:
        reply = self.redis.command("KEYS", pattern).decode()
        names = [line for line in reply.split("\r\n") if line and not line.startswith(("*", "$"))]
        return [n.split(":", 2)[2] for n in names]
