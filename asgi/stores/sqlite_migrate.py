"""Upgrades a SQLite state file written before the bounds in bytes (schema version 2).

Such a file kept a response's input items inside its record and no sizes: the items move to
rows of their own (so their list pages in the database) and every entry gets its size, so a
durable store keeps what it held across the upgrade. Runs in the opening transaction.
"""
from __future__ import annotations

import sqlite3

from rill.asgi.stores.base import encode, response_decoder

VERSION = 2
_COLUMNS = {"responses": ("num_bytes",), "conversations": ("num_bytes", "num_items")}


def migrate(conn: sqlite3.Connection) -> None:
    """After the schema's CREATE ... IF NOT EXISTS, which leaves an older table as it was."""
    if conn.execute("PRAGMA user_version").fetchall()[0][0] >= VERSION:
        return
    for table, columns in _COLUMNS.items():
        have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})").fetchall()}
        for column in columns:
            if column not in have:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} INTEGER NOT NULL DEFAULT 0")
    for response_id, body in conn.execute("SELECT id, body FROM responses").fetchall():
        record = response_decoder.decode(body)
        items = [(item.get("id", ""), encode(item)) for item in record.input_items]
        record.input_items = []
        body = encode(record)
        conn.execute("DELETE FROM response_items WHERE response_id = ?", (response_id,))
        conn.executemany("INSERT INTO response_items (response_id, item_id, body) VALUES (?, ?, ?)",
                         [(response_id, item_id, raw) for item_id, raw in items])
        conn.execute("UPDATE responses SET body = ?, num_bytes = ? WHERE id = ?",
                     (body, len(body) + sum(len(raw) for _, raw in items), response_id))
    conn.execute("UPDATE conversations SET "
                 "num_items = (SELECT COUNT(*) FROM conversation_items WHERE conversation_id = conversations.id), "
                 "num_bytes = length(body) + (SELECT COALESCE(SUM(length(body)), 0) FROM conversation_items "
                 "WHERE conversation_id = conversations.id)")
    conn.execute(f"PRAGMA user_version = {VERSION}")
