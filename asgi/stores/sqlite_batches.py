"""The Batch API's records in the SQLite state store: on the store's own connection and thread.

`files` and `batches` keep each record's JSON with the columns a list or a claim reads; a
batch's lease (`lease_owner` until `lease_until`) is how one API worker alone runs it: a claim
takes a free or expired lease in one transaction (BEGIN IMMEDIATE), so two workers never hold it.
"""
from __future__ import annotations

import sqlite3

from rill.asgi.stores.batch_store import ACTIVE_VALUES, FINAL, BatchStore, Order, RecordPage
from rill.asgi.stores.sqlite_store import SQLiteStore
from rill.asgi.stores.sqlite_tables import checkpoint, fetch_one, transaction

SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, created_at INTEGER NOT NULL,
    purpose TEXT NOT NULL, body BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, status TEXT NOT NULL, body BLOB NOT NULL,
    lease_owner TEXT NOT NULL DEFAULT '', lease_until REAL NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS batches_by_status ON batches (status, seq)
"""


class SQLiteBatches(BatchStore):
    def __init__(self, store: SQLiteStore):
        self.store = store
        self._ready: sqlite3.Connection | None = None  # the connection the tables were made on

    async def _run(self, fn, *args):
        return await self.store._run(self._with_tables, fn, *args)

    def _with_tables(self, conn: sqlite3.Connection, fn, *args):
        if self._ready is not conn:  # the first call on this (or a reopened) connection
            with transaction(conn):
                for statement in SCHEMA.split(";"):
                    conn.execute(statement)
            self._ready = conn
        return fn(conn, *args)

    # ---- files ----
    async def _add_file(self, file_id: str, created_at: int, purpose: str, body: bytes,
                        max_files: int | None) -> bool:
        return await self._run(_insert_file, file_id, created_at, purpose, body, max_files)

    async def _get_file(self, file_id: str) -> bytes | None:
        row = await self._run(fetch_one, "SELECT body FROM files WHERE id = ?", (file_id,))
        return row[0] if row else None

    async def _delete_file(self, file_id: str) -> bool:
        return await self._run(_delete, "files", file_id)

    async def _list_files(self, purpose: str | None, limit: int, order: Order,
                          after: str | None) -> RecordPage | None:
        return await self._run(_page, "files", limit, order, after, purpose)

    # ---- batches ----
    async def _add_batch(self, batch_id: str, status: str, body: bytes, max_batches: int) -> bool:
        return await self._run(_insert_batch, batch_id, status, body, max_batches)

    async def _get_batch(self, batch_id: str) -> bytes | None:
        row = await self._run(fetch_one, "SELECT body FROM batches WHERE id = ?", (batch_id,))
        return row[0] if row else None

    async def _list_batches(self, limit: int, after: str | None) -> RecordPage | None:
        return await self._run(_page, "batches", limit, "desc", after, None)

    async def _update_batch(self, batch_id: str, status: str, body: bytes, expected: tuple[str, ...]) -> bool:
        marks = ", ".join("?" * len(expected))
        return await self._run(_write, f"UPDATE batches SET status = ?, body = ? WHERE id = ? AND status IN ({marks})",
                               (status, body, batch_id, *expected))

    async def _claim_batch(self, owner: str, lease_s: float) -> str | None:
        return await self._run(self._claim, owner, lease_s)

    def _claim(self, conn: sqlite3.Connection, owner: str, lease_s: float) -> str | None:
        now = self.store.clock()
        marks = ", ".join("?" * len(ACTIVE_VALUES))
        free = f"SELECT id FROM batches WHERE status IN ({marks}) AND lease_until <= ? ORDER BY seq LIMIT 1"
        if not conn.execute(free, (*ACTIVE_VALUES, now)).fetchall():
            return None  # the common case, read without the write lock (every idle worker polls)
        with transaction(conn):
            rows = conn.execute(free, (*ACTIVE_VALUES, now)).fetchall()
            if not rows:
                return None
            conn.execute("UPDATE batches SET lease_owner = ?, lease_until = ? WHERE id = ?",
                         (owner, now + lease_s, rows[0][0]))
        return rows[0][0]

    async def _renew_lease(self, batch_id: str, owner: str, lease_s: float) -> bool:
        until = self.store.clock() + lease_s if lease_s > 0 else 0.0
        return await self._run(_write, "UPDATE batches SET lease_until = ? WHERE id = ? AND lease_owner = ? "
                                       "AND (lease_until > ? OR ? = 0)",
                               (until, batch_id, owner, self.store.clock(), until))


def _write(conn: sqlite3.Connection, sql: str, args: tuple) -> bool:
    with transaction(conn):
        return conn.execute(sql, args).rowcount > 0


def _insert_file(conn: sqlite3.Connection, file_id: str, created_at: int, purpose: str, body: bytes,
                 max_files: int | None) -> bool:
    with transaction(conn):
        if max_files is not None and conn.execute("SELECT COUNT(*) FROM files").fetchall()[0][0] >= max_files:
            return False
        conn.execute("INSERT INTO files (id, created_at, purpose, body) VALUES (?, ?, ?, ?)",
                     (file_id, created_at, purpose, body))
    return True


def _insert_batch(conn: sqlite3.Connection, batch_id: str, status: str, body: bytes, max_batches: int) -> bool:
    marks = ", ".join("?" * len(FINAL))
    with transaction(conn):
        if conn.execute("SELECT COUNT(*) FROM batches").fetchall()[0][0] >= max_batches:
            oldest = conn.execute(f"SELECT seq FROM batches WHERE status IN ({marks}) ORDER BY seq LIMIT 1",
                                  FINAL).fetchall()
            if not oldest:
                return False
            conn.execute("DELETE FROM batches WHERE seq = ?", (oldest[0][0],))
        conn.execute("INSERT INTO batches (id, status, body) VALUES (?, ?, ?)", (batch_id, status, body))
    return True


def _delete(conn: sqlite3.Connection, table: str, record_id: str) -> bool:
    with transaction(conn):
        found = conn.execute(f"DELETE FROM {table} WHERE id = ?", (record_id,)).rowcount > 0
    if found:
        checkpoint(conn)
    return found


def _page(conn: sqlite3.Connection, table: str, limit: int, order: Order, after: str | None,
          purpose: str | None) -> RecordPage | None:
    where, args = [], []
    with transaction(conn, "BEGIN"):
        if after is not None:
            rows = conn.execute(f"SELECT seq FROM {table} WHERE id = ?", (after,)).fetchall()
            if not rows:
                return None
            where.append("seq > ?" if order == "asc" else "seq < ?")
            args.append(rows[0][0])
        if purpose is not None:
            where.append("purpose = ?")
            args.append(purpose)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = conn.execute(f"SELECT body FROM {table} {clause} ORDER BY seq {order.upper()} LIMIT ?",
                            (*args, limit + 1)).fetchall()
    return RecordPage([body for (body,) in rows[:limit]], len(rows) > limit)
