"""`--state-store URL` to a store: where the Responses API and Conversations keep their state.

- empty (the default): SQLite in the run directory, shared by the server's API workers and
  removed with the run directory when the server stops;
- `sqlite:///path/state.db` (an absolute path after the third slash): SQLite, durable across restarts;
- `redis://[user:password@]host:port/db` (or `rediss://` for TLS): Redis, shared by several servers.
"""
from __future__ import annotations

from pathlib import Path

from rill.asgi.stores.base import Bounds, StateStore

DEFAULT_FILE = "state.db"


class StoreURLError(ValueError):
    pass


def describe(url: str) -> str:
    """What the start-up log says about the store (no password)."""
    if not url:
        return "SQLite in the run directory (gone when the server stops)"
    if url.startswith("sqlite://"):
        return f"SQLite at {sqlite_path(url)} (durable)"
    from rill.asgi.stores.redis_store import _without_password

    return f"Redis at {_without_password(url)}"


def check_url(url: str) -> None:
    """Fails fast at start on a URL no store takes."""
    if url and not url.startswith(("sqlite://", "redis://", "rediss://", "unix://")):
        raise StoreURLError(f"--state-store {url!r}: expected sqlite:///path/state.db or redis://host:port/db")
    if url.startswith("sqlite://"):
        sqlite_path(url)


def sqlite_path(url: str) -> Path:
    path = url[len("sqlite://"):]
    if not path.startswith("/") or path == "/":
        raise StoreURLError(f"--state-store {url!r}: a SQLite URL names an absolute file, as in "
                            "sqlite:///var/lib/rill/state.db")
    return Path(path)


def open_store(url: str, run_dir: Path, responses: Bounds, conversations: Bounds) -> StateStore:
    """Connects lazily: a store that is down gives 503s on its routes, never a failed start."""
    if url.startswith(("redis://", "rediss://", "unix://")):
        from rill.asgi.stores.redis_store import RedisStore

        return RedisStore(url, responses, conversations)
    from rill.asgi.stores.sqlite_store import SQLiteStore

    if url:
        return SQLiteStore(sqlite_path(url), responses, conversations, durable=True)
    return SQLiteStore(run_dir / DEFAULT_FILE, responses, conversations, durable=False)
