"""The File and Batch objects as OpenAI's spec writes them, their ids, and their states."""
from __future__ import annotations

import re
import time
import uuid
from enum import Enum
from typing import Any

import msgspec

# `\Z`, not `$`: `$` also matches before a final newline. Only these shapes ever name a key in the
# store or a file on disk (asgi/batch/file_disk.py), so no id can reach another path.
FILE_ID = r"^file-[0-9a-f]{32}\Z"
BATCH_ID = r"^batch_[0-9a-f]{32}\Z"
_FILE_ID, _BATCH_ID = re.compile(FILE_ID), re.compile(BATCH_ID)

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
COMPLETION_WINDOWS = {"24h": 24 * 3600}


class Purpose(str, Enum):
    BATCH = "batch"
    BATCH_OUTPUT = "batch_output"


class Status(str, Enum):
    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


# The states a runner still has work in; the others are final.
ACTIVE = (Status.VALIDATING, Status.IN_PROGRESS, Status.FINALIZING, Status.CANCELLING)


def is_file_id(value: str) -> bool:
    return _FILE_ID.fullmatch(value) is not None


def is_batch_id(value: str) -> bool:
    return _BATCH_ID.fullmatch(value) is not None


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex}"


def new_batch_id() -> str:
    return f"batch_{uuid.uuid4().hex}"


def new_batch_request_id() -> str:
    return f"batch_req_{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


class FileObject(msgspec.Struct, kw_only=True, omit_defaults=True):
    """OpenAI's `OpenAIFile`; `status` is deprecated there and always `processed` here (a file is
    whole once its upload returns)."""

    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    object: str  # "file"; with no default, so omit_defaults writes it
    status: str  # "processed"
    expires_at: int | None = None


class RequestCounts(msgspec.Struct):
    total: int = 0
    completed: int = 0
    failed: int = 0


class Batch(msgspec.Struct, kw_only=True, omit_defaults=True):
    """OpenAI's `Batch`. Fields not yet set are left out (the spec types them without null)."""

    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: str
    created_at: int
    expires_at: int
    object: str  # "batch"; with no default, so omit_defaults writes it
    model: str | None = None
    errors: dict[str, Any] | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts = msgspec.field(default_factory=RequestCounts)
    metadata: dict[str, str] | None = None
    usage: dict[str, Any] | None = None

    def move_to(self, status: Status) -> None:
        """The new state and its timestamp (`<status>_at`, set when the state changes)."""
        if self.status == status.value:
            return
        self.status = status.value
        stamp = f"{status.value}_at"
        if stamp in self.__struct_fields__:
            setattr(self, stamp, now())


def batch_errors(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """OpenAI's `errors` object: a list of {code, message, param, line}."""
    return {"object": "list", "data": errors}


encode = msgspec.json.Encoder().encode
file_decoder = msgspec.json.Decoder(FileObject)
batch_decoder = msgspec.json.Decoder(Batch)
