"""The state store in one SQLite file (WAL mode), shared by every API worker of a server.

Each worker holds one connection on a thread of its own, so no call blocks the event loop.
Writes are `BEGIN IMMEDIATE` transactions that also apply the bounds (what is past its TTL, then
the oldest past the count or the total bytes), so the file never holds more than its bounds
allow. Items live in rows of their own and lists read a page with LIMIT. `secure_delete` zeroes
what a delete frees, and a client's DELETE checkpoints the WAL, so deleted content leaves the
disk; freed pages are reused by later writes (no VACUUM).
"""
from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rill.asgi.stores.base import (
    MAX_CONVERSATION_ITEMS,
    AddResult,
    AfterNotFound,
    Bounds,
    Order,
    StateStore,
    StoreUnavailable,
)
from rill.asgi.stores.sqlite_migrate import migrate
from rill.asgi.stores.sqlite_tables import (
    CONVERSATIONS,
    RESPONSES,
    SCHEMA,
    Kind,
    checkpoint,
    drop,
    fetch_one,
    insert_items,
    seq_of,
    transaction,
)

log = logging.getLogger("rill.store")

class SQLiteStore(StateStore):
    """`durable`: fsync every commit (a store that outlives the server); else only the OS's
    page cache, which a killed process cannot lose either."""

    def __init__(self, path: Path, responses: Bounds, conversations: Bounds, *, durable: bool,
                 clock: Callable[[], float] = time.time):
        super().__init__(responses, conversations)
        self.path = path
        self.durable = durable
        self.clock = clock
        self._conn: sqlite3.Connection | None = None
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="rill-store")

    # ---- plumbing ----
    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._thread, self.call, fn, *args)

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Runs `fn(conn, *args)` on the store's connection (opened on first use, reopened after
        a failure); any SQLite error becomes StoreUnavailable."""
        try:
            if self._conn is None:
                self._conn = self._open()
            return fn(self._conn, *args)
        except sqlite3.Error as exc:
            self._close()
            log.error("the state store %s failed: %s", self.path, exc)  # never the content
            raise StoreUnavailable(f"the state store failed ({type(exc).__name__}: {exc})") from None

    def _open(self) -> sqlite3.Connection:
        """Workers that start together open the file together: switching a new file to WAL can then find it locked
        at once (SQLite does not wait where waiting could deadlock), so a locked open is tried again."""
        for attempt in range(40):
            try:
                return self._open_once()
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or attempt == 39:
                    raise
                time.sleep(0.05)  # on the store's own thread
        raise AssertionError("unreachable")

    def _open_once(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=10.0, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={'FULL' if self.durable else 'NORMAL'}")
            conn.execute("PRAGMA secure_delete=ON")
            with transaction(conn):  # idempotent: every worker runs it on its first call
                for statement in SCHEMA.split(";"):
                    conn.execute(statement)
                migrate(conn)  # a file written before the bounds in bytes
        except sqlite3.Error:
            conn.close()
            raise
        return conn

    def _close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
            self._conn = None

    async def close(self) -> None:
        """Closes the connection on its own thread (never opens one to close it)."""
        await asyncio.get_running_loop().run_in_executor(self._thread, self._close)
        self._thread.shutdown(wait=True)

    def _born_after(self, kind: Kind) -> float:
        return self.clock() - (self.responses if kind is RESPONSES else self.conversations).ttl_s

    def _evict(self, conn: sqlite3.Connection, kind: Kind, keep_id: str) -> None:
        """What is past its TTL, then the oldest past the count or the total bytes, with their
        items; `keep_id` (the entry just written) counts first, so it is never the one to go."""
        bounds = self.responses if kind is RESPONSES else self.conversations
        gone = conn.execute(
            f"SELECT id FROM {kind.table} WHERE stored_at <= ?2 UNION ALL "
            f"SELECT id FROM (SELECT id, ROW_NUMBER() OVER w AS n, SUM(num_bytes) OVER w AS running "
            f"FROM {kind.table} WHERE stored_at > ?2 WINDOW w AS (ORDER BY id = ?1 DESC, stored_at DESC, rowid DESC)) "
            f"WHERE n > ?3 OR running > ?4",
            (keep_id, self._born_after(kind), bounds.max_entries, bounds.max_bytes)).fetchall()
        drop(conn, kind, [row[0] for row in gone])

    def _alive(self, conn: sqlite3.Connection, kind: Kind, owner_id: str) -> tuple | None:
        rows = conn.execute(f"SELECT num_items, num_bytes FROM {kind.table} WHERE id = ? AND stored_at > ?"
                            if kind is CONVERSATIONS else
                            f"SELECT 0, num_bytes FROM {kind.table} WHERE id = ? AND stored_at > ?",
                            (owner_id, self._born_after(kind))).fetchall()
        return rows[0] if rows else None

    # ---- responses ----
    async def _put_response(self, response_id: str, body: bytes, items: list[tuple[str, bytes]],
                            num_bytes: int) -> None:
        await self._run(self._write_response, response_id, body, items, num_bytes)

    def _write_response(self, conn: sqlite3.Connection, response_id: str, body: bytes,
                        items: list[tuple[str, bytes]], num_bytes: int) -> None:
        with transaction(conn):
            (events,) = conn.execute("SELECT COALESCE(SUM(length(body)), 0) FROM response_events WHERE "
                                     "response_id = ?", (response_id,)).fetchall()[0]  # kept, and counted
            conn.execute("INSERT OR REPLACE INTO responses (id, stored_at, body, num_bytes) VALUES (?, ?, ?, ?)",
                         (response_id, self.clock(), body, num_bytes + events))
            conn.execute("DELETE FROM response_items WHERE response_id = ?", (response_id,))
            insert_items(conn, RESPONSES, response_id, items)
            self._evict(conn, RESPONSES, response_id)

    async def _get_response(self, response_id: str) -> bytes | None:
        row = await self._run(fetch_one, "SELECT body FROM responses WHERE id = ? AND stored_at > ?",
                              (response_id, self._born_after(RESPONSES)))
        return row[0] if row else None

    async def _delete_response(self, response_id: str) -> bool:
        return await self._run(self._delete_entry, RESPONSES, response_id)

    def _delete_entry(self, conn: sqlite3.Connection, kind: Kind, owner_id: str) -> bool:
        """A client's DELETE: the rows go, and so do the copies of them in the WAL."""
        with transaction(conn):
            found = drop(conn, kind, [owner_id]) > 0
        if found:
            checkpoint(conn)
        return found

    async def _page_response_items(self, response_id: str, limit: int, order: Order,
                                   after: str | None) -> tuple[list[bytes], bool] | None:
        return await self._run(self._page, RESPONSES, response_id, limit, order, after)

    def _page(self, conn: sqlite3.Connection, kind: Kind, owner_id: str, limit: int, order: Order,
              after: str | None) -> tuple[list[bytes], bool] | None:
        with transaction(conn, "BEGIN"):  # one snapshot: the owner and its items
            if self._alive(conn, kind, owner_id) is None:
                return None
            where, args = f"{kind.owner} = ?", [owner_id]
            if after is not None:
                if (seq := seq_of(conn, kind, owner_id, after)) is None:
                    raise AfterNotFound
                where += " AND seq > ?" if order == "asc" else " AND seq < ?"
                args.append(seq)
            rows = conn.execute(f"SELECT body FROM {kind.items} WHERE {where} ORDER BY seq {order.upper()} LIMIT ?",
                                (*args, limit + 1)).fetchall()
        return [body for (body,) in rows[:limit]], len(rows) > limit

    async def _append_events(self, response_id: str, first: int, events: list[bytes], num_bytes: int) -> bool:
        return await self._run(self._append_response_events, response_id, first, events, num_bytes)

    def _append_response_events(self, conn: sqlite3.Connection, response_id: str, first: int, events: list[bytes],
                                num_bytes: int) -> bool:
        with transaction(conn):
            alive = self._alive(conn, RESPONSES, response_id)
            if alive is None or alive[1] + num_bytes > self.responses.max_entry_bytes:
                return False
            (last,) = conn.execute("SELECT MAX(seq) FROM response_events WHERE response_id = ?",
                                   (response_id,)).fetchall()[0]
            if (-1 if last is None else last) != first - 1:
                return False
            conn.executemany("INSERT INTO response_events (response_id, seq, body) VALUES (?, ?, ?)",
                             [(response_id, first + i, body) for i, body in enumerate(events)])
            # A write: the TTL counts from it, so a background stream that outlives the TTL is not lost under its readers.
            conn.execute("UPDATE responses SET num_bytes = num_bytes + ?, stored_at = ? WHERE id = ?",
                         (num_bytes, self.clock(), response_id))
            self._evict(conn, RESPONSES, response_id)
        return True

    async def _read_events(self, response_id: str, after: int, limit: int) -> list[bytes] | None:
        return await self._run(self._read_response_events, response_id, after, limit)

    def _read_response_events(self, conn: sqlite3.Connection, response_id: str, after: int,
                              limit: int) -> list[bytes] | None:
        with transaction(conn, "BEGIN"):
            if self._alive(conn, RESPONSES, response_id) is None:
                return None
            rows = conn.execute("SELECT body FROM response_events WHERE response_id = ? AND seq > ? ORDER BY seq "
                                "LIMIT ?", (response_id, after, limit)).fetchall()
        return [body for (body,) in rows]

    # ---- conversations ----
    async def _put_conversation(self, conversation_id: str, body: bytes, items: list[tuple[str, bytes]]) -> None:
        await self._run(self._write_conversation, conversation_id, body, items)

    def _write_conversation(self, conn: sqlite3.Connection, conversation_id: str, body: bytes,
                            items: list[tuple[str, bytes]]) -> None:
        with transaction(conn):
            updated = conn.execute("UPDATE conversations SET num_bytes = num_bytes - length(body) + ?, body = ? "
                                   "WHERE id = ?", (len(body), body, conversation_id)).rowcount
            if not updated:
                conn.execute("INSERT INTO conversations (id, stored_at, body, num_bytes) VALUES (?, ?, ?, ?)",
                             (conversation_id, self.clock(), body, len(body)))
                self._append(conn, conversation_id, items)
            self._evict(conn, CONVERSATIONS, conversation_id)

    def _append(self, conn: sqlite3.Connection, conversation_id: str, items: list[tuple[str, bytes]]) -> None:
        insert_items(conn, CONVERSATIONS, conversation_id, items)
        conn.execute("UPDATE conversations SET num_items = num_items + ?, num_bytes = num_bytes + ? WHERE id = ?",
                     (len(items), sum(len(raw) for _, raw in items), conversation_id))

    async def _get_conversation(self, conversation_id: str) -> bytes | None:
        row = await self._run(fetch_one, "SELECT body FROM conversations WHERE id = ? AND stored_at > ?",
                              (conversation_id, self._born_after(CONVERSATIONS)))
        return row[0] if row else None

    async def _delete_conversation(self, conversation_id: str) -> bool:
        return await self._run(self._delete_entry, CONVERSATIONS, conversation_id)

    async def _add_items(self, conversation_id: str, items: list[tuple[str, bytes]]) -> AddResult:
        return await self._run(self._add, conversation_id, items)

    def _add(self, conn: sqlite3.Connection, conversation_id: str, items: list[tuple[str, bytes]]) -> AddResult:
        with transaction(conn):
            if (alive := self._alive(conn, CONVERSATIONS, conversation_id)) is None:
                return "gone"
            num_items, num_bytes = alive
            if num_items + len(items) > MAX_CONVERSATION_ITEMS:
                return "too_many_items"
            if num_bytes + sum(len(raw) for _, raw in items) > self.conversations.max_entry_bytes:
                return "too_many_bytes"
            self._append(conn, conversation_id, items)
            self._evict(conn, CONVERSATIONS, conversation_id)
        return "added"

    async def _all_items(self, conversation_id: str) -> list[bytes] | None:
        return await self._run(self._read_all, conversation_id)

    def _read_all(self, conn: sqlite3.Connection, conversation_id: str) -> list[bytes] | None:
        with transaction(conn, "BEGIN"):
            if self._alive(conn, CONVERSATIONS, conversation_id) is None:
                return None
            rows = conn.execute("SELECT body FROM conversation_items WHERE conversation_id = ? ORDER BY seq",
                                (conversation_id,)).fetchall()
        return [body for (body,) in rows]

    async def _page_items(self, conversation_id: str, limit: int, order: Order,
                          after: str | None) -> tuple[list[bytes], bool] | None:
        return await self._run(self._page, CONVERSATIONS, conversation_id, limit, order, after)

    async def _get_item(self, conversation_id: str, item_id: str) -> bytes | None:
        row = await self._run(fetch_one, "SELECT body FROM conversation_items WHERE conversation_id = ? AND "
                                          "item_id = ? ORDER BY seq LIMIT 1", (conversation_id, item_id))
        return row[0] if row else None

    async def _delete_item(self, conversation_id: str, item_id: str) -> bool:
        return await self._run(self._delete_one_item, conversation_id, item_id)

    def _delete_one_item(self, conn: sqlite3.Connection, conversation_id: str, item_id: str) -> bool:
        with transaction(conn):
            if (seq := seq_of(conn, CONVERSATIONS, conversation_id, item_id)) is None:
                return False
            (num_bytes,) = conn.execute("SELECT length(body) FROM conversation_items WHERE seq = ?",
                                        (seq,)).fetchall()[0]
            conn.execute("DELETE FROM conversation_items WHERE seq = ?", (seq,))
            conn.execute("UPDATE conversations SET num_items = num_items - 1, num_bytes = num_bytes - ? "
                         "WHERE id = ?", (num_bytes, conversation_id))
        checkpoint(conn)
        return True
