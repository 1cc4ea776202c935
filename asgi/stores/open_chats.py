"""Stored chat completions beside a state store: the SQLite or Redis implementation of ChatStore."""
from __future__ import annotations

from rill.asgi.stores.base import Bounds, StateStore
from rill.asgi.stores.chat_store import ChatStore


def chat_store_for(store: StateStore, bounds: Bounds) -> ChatStore:
    """The stored completions of `store`, on its own connection (SQLite) or client (Redis)."""
    from rill.asgi.stores.sqlite_store import SQLiteStore

    if isinstance(store, SQLiteStore):
        from rill.asgi.stores.sqlite_chats import SQLiteChats

        return SQLiteChats(store, bounds)
    from rill.asgi.stores.redis_chats import RedisChats

    return RedisChats(store, bounds)
