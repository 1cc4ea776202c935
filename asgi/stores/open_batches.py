"""The Batch API's records beside a state store: the SQLite or Redis implementation of BatchStore."""
from __future__ import annotations

from rill.asgi.stores.base import StateStore
from rill.asgi.stores.batch_store import BatchStore


def batch_store_for(store: StateStore) -> BatchStore:
    """The batch records of `store`, on its own connection (SQLite) or client (Redis)."""
    from rill.asgi.stores.sqlite_store import SQLiteStore

    if isinstance(store, SQLiteStore):
        from rill.asgi.stores.sqlite_batches import SQLiteBatches

        return SQLiteBatches(store)
    from rill.asgi.stores.redis_batches import RedisBatches

    return RedisBatches(store)
