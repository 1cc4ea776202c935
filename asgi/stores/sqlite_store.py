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

log = logging.getLogger("rill.store")

SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY, stored_at REAL NOT NULL, body BLOB NOT NULL, num_bytes INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS responses_by_age ON responses (stored_at);
CREATE TABLE IF NOT EXISTS response_items (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, response_id TEXT NOT NULL, item_id TEXT NOT NULL, body BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS response_items_by_owner ON response_items (response_id, seq);
CREATE INDEX IF NOT EXISTS response_items_by_id ON response_items (response_id, item_id);
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY, stored_at REAL NOT NULL, body BLOB NOT NULL, num_bytes INTEGER NOT NULL DEFAULT 0,
    num_items INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS conversations_by_age ON conversations (stored_at);
CREATE TABLE IF NOT EXISTS conversation_items (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, conversation_id TEXT NOT NULL, item_id TEXT NOT NULL, body BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS items_by_conversation ON conversation_items (conversation_id, seq);
CREATE INDEX IF NOT EXISTS items_by_id ON conversation_items (conversation_id, item_id);
"""


class _Kind:
    """A kind of entry: its table, its items' table and the column that names the owner."""

    def __init__(self, table: str, items: str, owner: str):
        self.table, self.items, self.owner = table, items, owner


RESPONSES = _Kind("responses", "response_items", "response_id")
CONVERSATIONS = _Kind("conversations", "conversation_items", "conversation_id")


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
        conn = sqlite3.connect(self.path, timeout=10.0, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={'FULL' if self.durable else 'NORMAL'}")
            conn.execute("PRAGMA secure_delete=ON")
            with _transaction(conn):  # idempotent: every worker runs it on its first call
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

    def _born_after(self, kind: _Kind) -> float:
        return self.clock() - (self.responses if kind is RESPONSES else self.conversations).ttl_s

    def _evict(self, conn: sqlite3.Connection, kind: _Kind, keep_id: str) -> None:
        """What is past its TTL, then the oldest past the count or the total bytes, with their
        items; `keep_id` (the entry just written) counts first, so it is never the one to go."""
        bounds = self.responses if kind is RESPONSES else self.conversations
        gone = conn.execute(
            f"SELECT id FROM {kind.table} WHERE stored_at <= ?2 UNION ALL "
            f"SELECT id FROM (SELECT id, ROW_NUMBER() OVER w AS n, SUM(num_bytes) OVER w AS running "
            f"FROM {kind.table} WHERE stored_at > ?2 WINDOW w AS (ORDER BY id = ?1 DESC, stored_at DESC, rowid DESC)) "
            f"WHERE n > ?3 OR running > ?4",
            (keep_id, self._born_after(kind), bounds.max_entries, bounds.max_bytes)).fetchall()
        _drop(conn, kind, [row[0] for row in gone])

    def _alive(self, conn: sqlite3.Connection, kind: _Kind, owner_id: str) -> tuple | None:
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
        with _transaction(conn):
            conn.execute("INSERT OR REPLACE INTO responses (id, stored_at, body, num_bytes) VALUES (?, ?, ?, ?)",
                         (response_id, self.clock(), body, num_bytes))
            conn.execute("DELETE FROM response_items WHERE response_id = ?", (response_id,))
            _insert_items(conn, RESPONSES, response_id, items)
            self._evict(conn, RESPONSES, response_id)

    async def _get_response(self, response_id: str) -> bytes | None:
        row = await self._run(_fetch_one, "SELECT body FROM responses WHERE id = ? AND stored_at > ?",
                              (response_id, self._born_after(RESPONSES)))
        return row[0] if row else None

    async def _delete_response(self, response_id: str) -> bool:
        return await self._run(self._delete_entry, RESPONSES, response_id)

    def _delete_entry(self, conn: sqlite3.Connection, kind: _Kind, owner_id: str) -> bool:
        """A client's DELETE: the rows go, and so do the copies of them in the WAL."""
        with _transaction(conn):
            found = _drop(conn, kind, [owner_id]) > 0
        if found:
            _checkpoint(conn)
        return found

    async def _page_response_items(self, response_id: str, limit: int, order: Order,
                                   after: str | None) -> tuple[list[bytes], bool] | None:
        return await self._run(self._page, RESPONSES, response_id, limit, order, after)

    def _page(self, conn: sqlite3.Connection, kind: _Kind, owner_id: str, limit: int, order: Order,
              after: str | None) -> tuple[list[bytes], bool] | None:
        with _transaction(conn, "BEGIN"):  # one snapshot: the owner and its items
            if self._alive(conn, kind, owner_id) is None:
                return None
            where, args = f"{kind.owner} = ?", [owner_id]
            if after is not None:
                if (seq := _seq_of(conn, kind, owner_id, after)) is None:
                    raise AfterNotFound
                where += " AND seq > ?" if order == "asc" else " AND seq < ?"
                args.append(seq)
            rows = conn.execute(f"SELECT body FROM {kind.items} WHERE {where} ORDER BY seq {order.upper()} LIMIT ?",
                                (*args, limit + 1)).fetchall()
        return [body for (body,) in rows[:limit]], len(rows) > limit

    # ---- conversations ----
    async def _put_conversation(self, conversation_id: str, body: bytes, items: list[tuple[str, bytes]]) -> None:
        await self._run(self._write_conversation, conversation_id, body, items)

    def _write_conversation(self, conn: sqlite3.Connection, conversation_id: str, body: bytes,
                            items: list[tuple[str, bytes]]) -> None:
        with _transaction(conn):
            updated = conn.execute("UPDATE conversations SET num_bytes = num_bytes - length(body) + ?, body = ? "
                                   "WHERE id = ?", (len(body), body, conversation_id)).rowcount
            if not updated:
                conn.execute("INSERT INTO conversations (id, stored_at, body, num_bytes) VALUES (?, ?, ?, ?)",
                             (conversation_id, self.clock(), body, len(body)))
                self._append(conn, conversation_id, items)
            self._evict(conn, CONVERSATIONS, conversation_id)

    def _append(self, conn: sqlite3.Connection, conversation_id: str, items: list[tuple[str, bytes]]) -> None:
        _insert_items(conn, CONVERSATIONS, conversation_id, items)
        conn.execute("UPDATE conversations SET num_items = num_items + ?, num_bytes = num_bytes + ? WHERE id = ?",
                     (len(items), sum(len(raw) for _, raw in items), conversation_id))

    async def _get_conversation(self, conversation_id: str) -> bytes | None:
        row = await self._run(_fetch_one, "SELECT body FROM conversations WHERE id = ? AND stored_at > ?",
                              (conversation_id, self._born_after(CONVERSATIONS)))
        return row[0] if row else None

    async def _delete_conversation(self, conversation_id: str) -> bool:
        return await self._run(self._delete_entry, CONVERSATIONS, conversation_id)

    async def _add_items(self, conversation_id: str, items: list[tuple[str, bytes]]) -> AddResult:
        return await self._run(self._add, conversation_id, items)

    def _add(self, conn: sqlite3.Connection, conversation_id: str, items: list[tuple[str, bytes]]) -> AddResult:
        with _transaction(conn):
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
        with _transaction(conn, "BEGIN"):
            if self._alive(conn, CONVERSATIONS, conversation_id) is None:
                return None
            rows = conn.execute("SELECT body FROM conversation_items WHERE conversation_id = ? ORDER BY seq",
                                (conversation_id,)).fetchall()
        return [body for (body,) in rows]

    async def _page_items(self, conversation_id: str, limit: int, order: Order,
                          after: str | None) -> tuple[list[bytes], bool] | None:
        return await self._run(self._page, CONVERSATIONS, conversation_id, limit, order, after)

    async def _get_item(self, conversation_id: str, item_id: str) -> bytes | None:
        row = await self._run(_fetch_one, "SELECT body FROM conversation_items WHERE conversation_id = ? AND "
                                          "item_id = ? ORDER BY seq LIMIT 1", (conversation_id, item_id))
        return row[0] if row else None

    async def _delete_item(self, conversation_id: str, item_id: str) -> bool:
        return await self._run(self._delete_one_item, conversation_id, item_id)

    def _delete_one_item(self, conn: sqlite3.Connection, conversation_id: str, item_id: str) -> bool:
        with _transaction(conn):
            if (seq := _seq_of(conn, CONVERSATIONS, conversation_id, item_id)) is None:
                return False
            (num_bytes,) = conn.execute("SELECT length(body) FROM conversation_items WHERE seq = ?",
                                        (seq,)).fetchall()[0]
            conn.execute("DELETE FROM conversation_items WHERE seq = ?", (seq,))
            conn.execute("UPDATE conversations SET num_items = num_items - 1, num_bytes = num_bytes - ? "
                         "WHERE id = ?", (num_bytes, conversation_id))
        _checkpoint(conn)
        return True


class _transaction:
    """BEGIN IMMEDIATE (a writer waits for the lock up front, never fails half-way) ... COMMIT."""

    def __init__(self, conn: sqlite3.Connection, begin: str = "BEGIN IMMEDIATE"):
        self.conn, self.begin = conn, begin

    def __enter__(self) -> None:
        self.conn.execute(self.begin)

    def __exit__(self, exc_type, exc, tb) -> None:
        self.conn.execute("COMMIT" if exc_type is None else "ROLLBACK")


def _insert_items(conn: sqlite3.Connection, kind: _Kind, owner_id: str, items: list[tuple[str, bytes]]) -> None:
    conn.executemany(f"INSERT INTO {kind.items} ({kind.owner}, item_id, body) VALUES (?, ?, ?)",
                     [(owner_id, item_id, body) for item_id, body in items])


def _drop(conn: sqlite3.Connection, kind: _Kind, ids: list[str]) -> int:
    """Entries and their items; how many entries there were."""
    found = 0
    for owner_id in ids:
        conn.execute(f"DELETE FROM {kind.items} WHERE {kind.owner} = ?", (owner_id,))
        found += conn.execute(f"DELETE FROM {kind.table} WHERE id = ?", (owner_id,)).rowcount
    return found


def _seq_of(conn: sqlite3.Connection, kind: _Kind, owner_id: str, item_id: str) -> int | None:
    rows = conn.execute(f"SELECT seq FROM {kind.items} WHERE {kind.owner} = ? AND item_id = ? ORDER BY seq LIMIT 1",
                        (owner_id, item_id)).fetchall()
    return rows[0][0] if rows else None


def _fetch_one(conn: sqlite3.Connection, sql: str, args: tuple) -> tuple | None:
    """fetchall, never fetchone: a statement not stepped to its end keeps its read transaction
    open, and this connection would go on reading that old snapshot of the WAL (other workers'
    writes unseen)."""
    rows = conn.execute(sql, args).fetchall()
    return rows[0] if rows else None


def _checkpoint(conn: sqlite3.Connection) -> None:
    """Copies the WAL into the file (where secure_delete zeroed the freed cells) and truncates it;
    if another worker is reading, its copy goes at a later delete's checkpoint."""
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
