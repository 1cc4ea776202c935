"""Stored Chat Completions in the SQLite state store: on the store's own connection and thread.

One row a completion: its record's JSON, its index (model and metadata) and its creation time. A write evicts in
its own transaction (BEGIN IMMEDIATE), so the bounds hold across the server's API workers.
"""
from __future__ import annotations

import sqlite3

from rill.asgi.stores.base import Bounds
from rill.asgi.stores.chat_store import ChatStore, Order
from rill.asgi.stores.sqlite_store import SQLiteStore
from rill.asgi.stores.sqlite_tables import checkpoint, fetch_one, transaction

SCHEMA = """
CREATE TABLE IF NOT EXISTS chat_completions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, stored_at REAL NOT NULL, idx BLOB NOT NULL,
    body BLOB NOT NULL)
"""


class SQLiteChats(ChatStore):
    def __init__(self, store: SQLiteStore, bounds: Bounds):
        super().__init__(bounds)
        self.store = store
        self._ready: sqlite3.Connection | None = None  # the connection the table was made on

    async def _run(self, fn, *args):
        return await self.store._run(self._with_table, fn, *args)

    def _with_table(self, conn: sqlite3.Connection, fn, *args):
        if self._ready is not conn:  # the first call on this (or a reopened) connection
            with transaction(conn):
                conn.execute(SCHEMA)
            self._ready = conn
        return fn(conn, *args)

    def _born_after(self) -> float:
        return self.store.clock() - self.bounds.ttl_s

    async def _put(self, completion_id: str, body: bytes, index: bytes) -> None:
        await self._run(self._insert, completion_id, body, index)

    def _insert(self, conn: sqlite3.Connection, completion_id: str, body: bytes, index: bytes) -> None:
        with transaction(conn):
            conn.execute("INSERT OR REPLACE INTO chat_completions (id, stored_at, idx, body) VALUES (?, ?, ?, ?)",
                         (completion_id, self.store.clock(), index, body))
            conn.execute("DELETE FROM chat_completions WHERE stored_at <= ? AND id != ?",
                         (self._born_after(), completion_id))
            gone = conn.execute(
                "SELECT id FROM (SELECT id, ROW_NUMBER() OVER w AS n, SUM(length(body) + length(idx)) OVER w AS running "
                "FROM chat_completions WINDOW w AS (ORDER BY id = ?1 DESC, seq DESC)) WHERE n > ?2 OR running > ?3",
                (completion_id, self.bounds.max_entries, self.bounds.max_bytes)).fetchall()
            conn.executemany("DELETE FROM chat_completions WHERE id = ?", gone)

    async def _get(self, completion_id: str) -> bytes | None:
        row = await self._run(fetch_one, "SELECT body FROM chat_completions WHERE id = ? AND stored_at > ?",
                              (completion_id, self._born_after()))
        return row[0] if row else None

    async def _replace(self, completion_id: str, body: bytes, index: bytes) -> bool:
        return await self._run(self._update, completion_id, body, index)

    def _update(self, conn: sqlite3.Connection, completion_id: str, body: bytes, index: bytes) -> bool:
        with transaction(conn):
            return conn.execute("UPDATE chat_completions SET body = ?, idx = ? WHERE id = ? AND stored_at > ?",
                                (body, index, completion_id, self._born_after())).rowcount > 0

    async def _delete(self, completion_id: str) -> bool:
        return await self._run(self._delete_row, completion_id)

    def _delete_row(self, conn: sqlite3.Connection, completion_id: str) -> bool:
        """A client's DELETE: the row goes, and so do the copies of it in the WAL."""
        with transaction(conn):
            found = conn.execute("DELETE FROM chat_completions WHERE id = ? AND stored_at > ?",
                                 (completion_id, self._born_after())).rowcount > 0
        if found:
            checkpoint(conn)
        return found

    async def _ids(self, order: Order) -> list[tuple[str, bytes]]:
        return await self._run(_read_all, f"SELECT id, idx FROM chat_completions WHERE stored_at > ? ORDER BY seq "
                                          f"{'ASC' if order == 'asc' else 'DESC'}", (self._born_after(),))

    async def _bodies(self, ids: list[str]) -> list[bytes | None]:
        if not ids:
            return []
        rows = await self._run(_read_all, f"SELECT id, body FROM chat_completions WHERE id IN "
                                          f"({', '.join('?' * len(ids))})", tuple(ids))
        found = dict(rows)
        return [found.get(cid) for cid in ids]


def _read_all(conn: sqlite3.Connection, sql: str, args: tuple) -> list[tuple]:
    return conn.execute(sql, args).fetchall()
