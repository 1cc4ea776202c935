"""The Batch API's files on disk: one file per id in one folder, and a batch's output while it runs.

Paths are built only from ids of the server's own shape (asgi/batch/records.py), checked here
again, so no id a client sends can name another path. An upload is written to a temporary name
and renamed, so a file is whole or absent. A running batch appends its output and error lines to
`<batch id>.output.jsonl` and `<batch id>.errors.jsonl`, flushed line by line; on resume a torn
last line (the process died in the middle of it) is cut off and that line is run again.
"""
from __future__ import annotations

import os
from pathlib import Path

from rill.asgi.batch.records import is_batch_id, is_file_id

CHUNK_BYTES = 1 << 20  # what a download reads and sends at a time


class FileDisk:
    def __init__(self, folder: Path):
        self.folder = folder

    def ensure(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)

    def path(self, file_id: str) -> Path:
        if not is_file_id(file_id):
            raise ValueError(f"not a file id of the server's shape: {file_id[:80]!r}")
        return self.folder / f"{file_id}.jsonl"

    def work_path(self, batch_id: str, kind: str) -> Path:
        if not is_batch_id(batch_id) or kind not in ("output", "errors"):
            raise ValueError(f"not a batch id of the server's shape: {batch_id[:80]!r}")
        return self.folder / f"{batch_id}.{kind}.jsonl"

    def write(self, file_id: str, data: bytes) -> None:
        self.ensure()
        final = self.path(file_id)
        partial = final.with_suffix(".partial")
        with open(partial, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, final)

    def read(self, file_id: str) -> bytes:
        return self.path(file_id).read_bytes()

    def delete(self, file_id: str) -> None:
        self.path(file_id).unlink(missing_ok=True)

    def adopt(self, batch_id: str, kind: str, file_id: str) -> int:
        """A finished batch's work file becomes the file `file_id`; its size in bytes."""
        src = self.work_path(batch_id, kind)
        size = src.stat().st_size
        os.replace(src, self.path(file_id))
        return size

    def whole_lines(self, batch_id: str, kind: str) -> list[bytes]:
        """The lines a batch wrote so far, a torn last one cut off the file."""
        path = self.work_path(batch_id, kind)
        if not path.exists():
            return []
        data = path.read_bytes()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            with open(path, "r+b") as f:
                f.truncate(end)
        return data[:end].splitlines()


class LineWriter:
    """Appends a batch's lines to one work file, each flushed to the OS before it counts as done."""

    def __init__(self, path: Path):
        self.path = path
        self._file = None
        self.num_lines = 0

    def append(self, line: bytes) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._file = open(self.path, "ab")
        self._file.write(line + b"\n")
        self._file.flush()
        self.num_lines += 1

    def close(self) -> None:
        if self._file is not None:
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None


def files_folder(files_dir: str, state_store_url: str, run_dir: Path) -> Path:
    """--files-dir, else beside the state store: a `files` folder next to a SQLite file, or in the
    run directory (gone with the server, as the default store is; with Redis, servers that share it
    need a --files-dir they share too)."""
    if files_dir:
        return Path(files_dir)
    if state_store_url.startswith("sqlite://"):
        from rill.asgi.stores.open import sqlite_path

        return sqlite_path(state_store_url).parent / "files"
    return run_dir / "files"
