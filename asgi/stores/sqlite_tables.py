"""The SQLite state store's tables, and the statements on their rows that its writes and reads share."""
from __future__ import annotations

import sqlite3

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
CREATE TABLE IF NOT EXISTS response_events (
    response_id TEXT NOT NULL, seq INTEGER NOT NULL, body BLOB NOT NULL, PRIMARY KEY (response_id, seq));
"""


class Kind:
    """A kind of entry: its table, its items' table, the column that names the owner, and the other tables of rows
    it owns (a response's streamed events)."""

    def __init__(self, table: str, items: str, owner: str, owned: tuple[str, ...] = ()):
        self.table, self.items, self.owner, self.owned = table, items, owner, owned


RESPONSES = Kind("responses", "response_items", "response_id", ("response_events",))
CONVERSATIONS = Kind("conversations", "conversation_items", "conversation_id")


class transaction:
    """BEGIN IMMEDIATE (a writer waits for the lock up front, never fails half-way) ... COMMIT."""

    def __init__(self, conn: sqlite3.Connection, begin: str = "BEGIN IMMEDIATE"):
        self.conn, self.begin = conn, begin

    def __enter__(self) -> None:
        self.conn.execute(self.begin)

    def __exit__(self, exc_type, exc, tb) -> None:
        self.conn.execute("COMMIT" if exc_type is None else "ROLLBACK")


def insert_items(conn: sqlite3.Connection, kind: Kind, owner_id: str, items: list[tuple[str, bytes]]) -> None:
    conn.executemany(f"INSERT INTO {kind.items} ({kind.owner}, item_id, body) VALUES (?, ?, ?)",
                     [(owner_id, item_id, body) for item_id, body in items])


def drop(conn: sqlite3.Connection, kind: Kind, ids: list[str]) -> int:
    """Entries and their items; how many entries there were."""
    found = 0
    for owner_id in ids:
        for table in (kind.items, *kind.owned):
            conn.execute(f"DELETE FROM {table} WHERE {kind.owner} = ?", (owner_id,))
        found += conn.execute(f"DELETE FROM {kind.table} WHERE id = ?", (owner_id,)).rowcount
    return found


def seq_of(conn: sqlite3.Connection, kind: Kind, owner_id: str, item_id: str) -> int | None:
    rows = conn.execute(f"SELECT seq FROM {kind.items} WHERE {kind.owner} = ? AND item_id = ? ORDER BY seq LIMIT 1",
                        (owner_id, item_id)).fetchall()
    return rows[0][0] if rows else None


def fetch_one(conn: sqlite3.Connection, sql: str, args: tuple) -> tuple | None:
    """fetchall, never fetchone: a statement not stepped to its end keeps its read transaction
    open, and this connection would go on reading that old snapshot of the WAL (other workers'
    writes unseen)."""
    rows = conn.execute(sql, args).fetchall()
    return rows[0] if rows else None


def checkpoint(conn: sqlite3.Connection) -> None:
    """Copies the WAL into the file (where secure_delete zeroed the freed cells) and truncates it;
    if another worker is reading, its copy goes at a later delete's checkpoint."""
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
