"""Stored Chat Completions (`store: true`): what OpenAI's list, retrieve, update, delete and messages routes read.

Each completion is one record: the ChatCompletion object as the client got it (for a stream, the chunks put
together), its `metadata`, and the request's messages, each with its id (`<completion id>-<index>`). It lives
beside the Responses API's state (the same `--state-store`: SQLite by default, Redis across servers), under its own
bounds: at most `max_entries` and `max_bytes` in all (the oldest go first), each kept `ttl_s` from its creation, one
at most `max_entry_bytes` (a larger one is not kept: the client has its answer, and a warning says so). The model and
metadata are kept beside each record, so a list filters without reading the records; a list reads only its page's.
"""
from __future__ import annotations

import abc
import logging
import re
from typing import Any, Literal

import msgspec

from rill.asgi.stores.base import Bounds

log = logging.getLogger("rill.store")

# The ids Rill mints for chat completions (asgi/engine_link/generate.py new_request_id): only these are keys.
CHAT_ID = r"^chatcmpl-[A-Za-z0-9_-]{1,128}\Z"  # the router's `{completion_id:chat}`
COMPLETION_ID = re.compile(CHAT_ID)
Order = Literal["asc", "desc"]


class StoredChat(msgspec.Struct, kw_only=True):
    completion: dict[str, Any]  # the ChatCompletion, its `metadata` included
    messages: list[dict[str, Any]]  # the request's, each with its `id`


class Index(msgspec.Struct, kw_only=True):
    """What a list filters by, kept beside the record."""
    model: str
    metadata: dict[str, str]


def is_completion_id(value: str) -> bool:
    return COMPLETION_ID.fullmatch(value) is not None


def matches(index: Index, model: str | None, metadata: dict[str, str]) -> bool:
    return (model is None or index.model == model) and all(index.metadata.get(k) == v for k, v in metadata.items())


class ChatStore(abc.ABC):
    def __init__(self, bounds: Bounds):
        self.bounds = bounds

    async def put(self, record: StoredChat) -> bool:
        """Keeps a new completion; False (and a warning) when it is past its bytes or the store is off."""
        completion_id = record.completion["id"]
        if not (self.bounds.enabled and is_completion_id(completion_id)):
            return False
        body = encode(record)
        if len(body) > self.bounds.max_entry_bytes:
            log.warning("chat completion %s is %d bytes, over the store's %d: not stored", completion_id, len(body),
                        self.bounds.max_entry_bytes)
            return False
        await self._put(completion_id, body, encode(_index(record)))
        return True

    async def get(self, completion_id: str) -> StoredChat | None:
        raw = await self._get(completion_id) if self.bounds.enabled and is_completion_id(completion_id) else None
        return record_decoder.decode(raw) if raw is not None else None

    async def set_metadata(self, completion_id: str, metadata: dict[str, str]) -> StoredChat | None:
        """The record with its metadata replaced (its TTL unchanged); None if it is gone."""
        record = await self.get(completion_id)
        if record is None:
            return None
        record.completion["metadata"] = metadata
        if not await self._replace(completion_id, encode(record), encode(_index(record))):
            return None
        return record

    async def delete(self, completion_id: str) -> bool:
        return self.bounds.enabled and is_completion_id(completion_id) and await self._delete(completion_id)

    async def list(self, model: str | None, metadata: dict[str, str], limit: int, order: Order,
                   after: str | None) -> tuple[list[dict[str, Any]], bool] | None:
        """A page of completions that match (`model`, every pair of `metadata`), oldest first for `asc`, after the
        completion `after`; None when `after` names none kept."""
        if not self.bounds.enabled:
            return None if after is not None else ([], False)
        if after is not None and not is_completion_id(after):
            return None
        ids = await self._ids(order)  # (id, index) by creation, at most max_entries
        start = 0
        if after is not None:
            start = next((i + 1 for i, (cid, _) in enumerate(ids) if cid == after), -1)
            if start < 0:
                return None
        chosen = [cid for cid, raw in ids[start:] if matches(index_decoder.decode(raw), model, metadata)][:limit + 1]
        bodies = await self._bodies(chosen[:limit])
        found = [record_decoder.decode(raw).completion for raw in bodies if raw is not None]  # evicted in between
        return found, len(chosen) > limit

    async def close(self) -> None:
        return None

    # ---- the back end: ids checked, JSON encoded ----
    @abc.abstractmethod
    async def _put(self, completion_id: str, body: bytes, index: bytes) -> None:
        """Inserts, then evicts what is past its TTL and the oldest past the count or bytes (never this one)."""

    @abc.abstractmethod
    async def _get(self, completion_id: str) -> bytes | None: ...

    @abc.abstractmethod
    async def _replace(self, completion_id: str, body: bytes, index: bytes) -> bool:
        """Rewrites a record still kept, keeping its age; False if it is gone."""

    @abc.abstractmethod
    async def _delete(self, completion_id: str) -> bool: ...

    @abc.abstractmethod
    async def _ids(self, order: Order) -> list[tuple[str, bytes]]:
        """Every live completion's id and index, in creation order (`asc`) or its reverse."""

    @abc.abstractmethod
    async def _bodies(self, ids: list[str]) -> list[bytes | None]: ...


def _index(record: StoredChat) -> Index:
    return Index(model=record.completion.get("model", ""), metadata=record.completion.get("metadata") or {})


def encode(obj: Any) -> bytes:
    return msgspec.json.encode(obj)


record_decoder = msgspec.json.Decoder(StoredChat)
index_decoder = msgspec.json.Decoder(Index)

