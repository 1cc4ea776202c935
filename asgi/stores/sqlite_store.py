"""The state store in one SQLite file (WAL mode), shared by every API worker of a server.

Each worker holds one connection on a thread of its own, so no call blocks the event loop.
Writes are `BEGIN IMMEDIATE` transactions that also apply the bounds (indexed deletes by age,
then by count), so the file never holds more than its bounds allow. `secure_delete` zeroes what
a delete frees, and a client's DELETE checkpoints the WAL, so deleted content leaves the disk;
freed pages are reused by later writes (no VACUUM).
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

from asgi.stores.base import (
    Bounds,
    Conversation,
    StateStore,
    StoredResponse,
    StoreUnavailable,
    conversation_decoder,
    encode,
    item_decoder,
    response_decoder,
)

log = logging.getLogger("rill.store")

SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, stored_at REAL NOT NULL, body BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS responses_by_age ON responses (stored_at);
CREATE TABLE IF NOT EXISTS conversations (id TEXT PRIMARY KEY, stored_at REAL NOT NULL, body BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS conversations_by_age ON conversations (stored_at);
CREATE TABLE IF NOT EXISTS conversation_items (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, conversation_id TEXT NOT NULL, item_id TEXT NOT NULL, body BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS items_by_conversation ON conversation_items (conversation_id, seq);
"""
_GONE_CONVERSATIONS = "SELECT id FROM conversations WHERE stored_at <= ?1 UNION SELECT id FROM (" \
                      "SELECT id FROM conversations ORDER BY stored_at DESC LIMIT -1 OFFSET ?2)"


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
            conn.executescript(SCHEMA)  # idempotent: every worker runs it on its first call
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

    # ---- responses ----
    async def put_response(self, record: StoredResponse) -> None:
        await self._run(self._put_response, record.id, encode(record))

    def _put_response(self, conn: sqlite3.Connection, response_id: str, body: bytes) -> None:
        now = self.clock()
        with _transaction(conn):
            conn.execute("INSERT OR REPLACE INTO responses (id, stored_at, body) VALUES (?, ?, ?)",
                         (response_id, now, body))
            conn.execute("DELETE FROM responses WHERE stored_at <= ?", (now - self.responses.ttl_s,))
            conn.execute("DELETE FROM responses WHERE id IN (SELECT id FROM responses ORDER BY stored_at DESC "
                         "LIMIT -1 OFFSET ?)", (self.responses.max_entries,))

    async def get_response(self, response_id: str) -> StoredResponse | None:
        row = await self._run(_fetch_one, "SELECT body FROM responses WHERE id = ? AND stored_at > ?",
                              (response_id, self.clock() - self.responses.ttl_s))
        return response_decoder.decode(row[0]) if row else None

    async def delete_response(self, response_id: str) -> bool:
        return await self._run(_delete, "DELETE FROM responses WHERE id = ?", (response_id,))

    # ---- conversations ----
    async def put_conversation(self, conv: Conversation, items: list[dict[str, Any]] | None = None) -> None:
        await self._run(self._put_conversation, conv, items)

    def _put_conversation(self, conn: sqlite3.Connection, conv: Conversation, items: list[dict] | None) -> None:
        now = self.clock()
        with _transaction(conn):
            updated = conn.execute("UPDATE conversations SET body = ? WHERE id = ?", (encode(conv), conv.id)).rowcount
            if not updated:
                conn.execute("INSERT INTO conversations (id, stored_at, body) VALUES (?, ?, ?)",
                             (conv.id, now, encode(conv)))
            if items:
                _insert_items(conn, conv.id, items)
            gone = (now - self.conversations.ttl_s, self.conversations.max_entries)
            conn.execute(f"DELETE FROM conversation_items WHERE conversation_id IN ({_GONE_CONVERSATIONS})", gone)
            conn.execute(f"DELETE FROM conversations WHERE id IN ({_GONE_CONVERSATIONS})", gone)

    async def get_conversation(self, conversation_id: str) -> Conversation | None:
        row = await self._run(_fetch_one, "SELECT body FROM conversations WHERE id = ? AND stored_at > ?",
                              (conversation_id, self._conversations_born_after()))
        return conversation_decoder.decode(row[0]) if row else None

    def _conversations_born_after(self) -> float:
        return self.clock() - self.conversations.ttl_s

    async def delete_conversation(self, conversation_id: str) -> bool:
        return await self._run(self._delete_conversation, conversation_id)

    def _delete_conversation(self, conn: sqlite3.Connection, conversation_id: str) -> bool:
        with _transaction(conn):
            conn.execute("DELETE FROM conversation_items WHERE conversation_id = ?", (conversation_id,))
            found = conn.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,)).rowcount > 0
        _checkpoint(conn)
        return found

    async def add_items(self, conversation_id: str, items: list[dict[str, Any]]) -> bool:
        return await self._run(self._add_items, conversation_id, items)

    def _add_items(self, conn: sqlite3.Connection, conversation_id: str, items: list[dict[str, Any]]) -> bool:
        with _transaction(conn):
            if not conn.execute("SELECT 1 FROM conversations WHERE id = ? AND stored_at > ?",
                                (conversation_id, self._conversations_born_after())).fetchall():
                return False
            _insert_items(conn, conversation_id, items)
        return True

    async def list_items(self, conversation_id: str) -> list[dict[str, Any]] | None:
        return await self._run(self._list_items, conversation_id)

    def _list_items(self, conn: sqlite3.Connection, conversation_id: str) -> list[dict[str, Any]] | None:
        with _transaction(conn, "BEGIN"):  # one snapshot: the conversation and its items
            if not conn.execute("SELECT 1 FROM conversations WHERE id = ? AND stored_at > ?",
                                (conversation_id, self._conversations_born_after())).fetchall():
                return None
            rows = conn.execute("SELECT body FROM conversation_items WHERE conversation_id = ? ORDER BY seq",
                                (conversation_id,)).fetchall()
        return [item_decoder.decode(body) for (body,) in rows]

    async def delete_item(self, conversation_id: str, item_id: str) -> bool:
        return await self._run(_delete, "DELETE FROM conversation_items WHERE conversation_id = ? AND item_id = ?",
                               (conversation_id, item_id))


class _transaction:
    """BEGIN IMMEDIATE (a writer waits for the lock up front, never fails half-way) ... COMMIT."""

    def __init__(self, conn: sqlite3.Connection, begin: str = "BEGIN IMMEDIATE"):
        self.conn, self.begin = conn, begin

    def __enter__(self) -> None:
        self.conn.execute(self.begin)

    def __exit__(self, exc_type, exc, tb) -> None:
        self.conn.execute("COMMIT" if exc_type is None else "ROLLBACK")


def _insert_items(conn: sqlite3.Connection, conversation_id: str, items: list[dict[str, Any]]) -> None:
    conn.executemany("INSERT INTO conversation_items (conversation_id, item_id, body) VALUES (?, ?, ?)",
                     [(conversation_id, item["id"], encode(item)) for item in items])


def _fetch_one(conn: sqlite3.Connection, sql: str, args: tuple) -> tuple | None:
    """fetchall, never fetchone: a statement not stepped to its end keeps its read transaction
    open, and this connection would go on reading that old snapshot of the WAL (other workers'
    writes unseen)."""
    rows = conn.execute(sql, args).fetchall()
    return rows[0] if rows else None


def _delete(conn: sqlite3.Connection, sql: str, args: tuple) -> bool:
    """A client's DELETE: the row goes, and so do the copies of it in the WAL."""
    found = conn.execute(sql, args).rowcount > 0
    if found:
        _checkpoint(conn)
    return found


def _checkpoint(conn: sqlite3.Connection) -> None:
    """Copies the WAL into the file (where secure_delete zeroed the freed cells) and truncates it;
    if another worker is reading, its copy goes at a later delete's checkpoint."""
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
