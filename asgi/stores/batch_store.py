"""What the Batch API keeps in the state store: file and batch records, and the lease that lets
one API worker alone run a batch.

The same back end as the Responses API (asgi/stores/open.py): SQLite by default, Redis when
several servers share the store. Records are the API objects as JSON (asgi/batch/records.py); a
batch's status is also kept apart, so that a change of state is a compare-and-set (the runner's
progress never overwrites a client's cancel). The files' bytes live on disk
(asgi/batch/file_disk.py), never here.
"""
from __future__ import annotations

import abc
from typing import Literal

import msgspec

from rill.asgi.batch.records import (
    ACTIVE,
    Batch,
    FileObject,
    Status,
    batch_decoder,
    encode,
    file_decoder,
    is_batch_id,
    is_file_id,
)

Order = Literal["asc", "desc"]
FINAL = tuple(s.value for s in Status if s not in ACTIVE)
ACTIVE_VALUES = tuple(s.value for s in ACTIVE)


class RecordPage(msgspec.Struct):
    items: list[bytes]
    has_more: bool


class BatchStore(abc.ABC):
    # ---- files ----
    async def add_file(self, record: FileObject, max_files: int | None) -> bool:
        """False when `max_files` are kept already (None: no bound, for a batch's output files)."""
        assert is_file_id(record.id)
        return await self._add_file(record.id, record.created_at, record.purpose, encode(record), max_files)

    async def get_file(self, file_id: str) -> FileObject | None:
        raw = await self._get_file(file_id) if is_file_id(file_id) else None
        return file_decoder.decode(raw) if raw is not None else None

    async def delete_file(self, file_id: str) -> bool:
        return is_file_id(file_id) and await self._delete_file(file_id)

    async def list_files(self, purpose: str | None, limit: int, order: Order,
                         after: str | None) -> tuple[list[FileObject], bool] | None:
        """None when `after` names no file."""
        if after is not None and not is_file_id(after):
            return None
        got = await self._list_files(purpose, limit, order, after)
        return None if got is None else ([file_decoder.decode(raw) for raw in got.items], got.has_more)

    # ---- batches ----
    async def add_batch(self, batch: Batch, max_batches: int) -> bool:
        """Past `max_batches`, the oldest finished batch's record goes; False if none has finished."""
        assert is_batch_id(batch.id)
        return await self._add_batch(batch.id, batch.status, encode(batch), max_batches)

    async def get_batch(self, batch_id: str) -> Batch | None:
        raw = await self._get_batch(batch_id) if is_batch_id(batch_id) else None
        return batch_decoder.decode(raw) if raw is not None else None

    async def list_batches(self, limit: int, after: str | None) -> tuple[list[Batch], bool] | None:
        """Newest first, as OpenAI; None when `after` names no batch."""
        if after is not None and not is_batch_id(after):
            return None
        got = await self._list_batches(limit, after)
        return None if got is None else ([batch_decoder.decode(raw) for raw in got.items], got.has_more)

    async def update_batch(self, batch: Batch, expected: tuple[str, ...]) -> bool:
        """Writes `batch` only if its stored status is one of `expected`."""
        assert is_batch_id(batch.id)
        return await self._update_batch(batch.id, batch.status, encode(batch), expected)

    async def claim_batch(self, owner: str, lease_s: float) -> str | None:
        """An active batch whose lease is free (the oldest first), now leased to `owner`."""
        return await self._claim_batch(owner, lease_s)

    async def renew_lease(self, batch_id: str, owner: str, lease_s: float) -> bool:
        """False when `owner` lost the lease (it expired and another worker took it)."""
        return await self._renew_lease(batch_id, owner, lease_s)

    async def release_lease(self, batch_id: str, owner: str) -> None:
        await self._renew_lease(batch_id, owner, 0.0)

    # ---- the back end ----
    @abc.abstractmethod
    async def _add_file(self, file_id: str, created_at: int, purpose: str, body: bytes,
                        max_files: int | None) -> bool: ...

    @abc.abstractmethod
    async def _get_file(self, file_id: str) -> bytes | None: ...

    @abc.abstractmethod
    async def _delete_file(self, file_id: str) -> bool: ...

    @abc.abstractmethod
    async def _list_files(self, purpose: str | None, limit: int, order: Order,
                          after: str | None) -> RecordPage | None: ...

    @abc.abstractmethod
    async def _add_batch(self, batch_id: str, status: str, body: bytes, max_batches: int) -> bool: ...

    @abc.abstractmethod
    async def _get_batch(self, batch_id: str) -> bytes | None: ...

    @abc.abstractmethod
    async def _list_batches(self, limit: int, after: str | None) -> RecordPage | None: ...

    @abc.abstractmethod
    async def _update_batch(self, batch_id: str, status: str, body: bytes, expected: tuple[str, ...]) -> bool: ...

    @abc.abstractmethod
    async def _claim_batch(self, owner: str, lease_s: float) -> str | None: ...

    @abc.abstractmethod
    async def _renew_lease(self, batch_id: str, owner: str, lease_s: float) -> bool:
        """A lease of 0 s releases it."""
