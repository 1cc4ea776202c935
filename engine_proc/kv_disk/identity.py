"""Which model a disk tier's blocks belong to: a folder per model identity, so no model ever reads another's KV."""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sys
from pathlib import Path

FORMAT_VERSION = 1  # of the identity and the block files (store.py's MAGIC names the file layout)
_WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt")


def model_identity(model_dir: str, *, dtype: str, block_size: int, block_layout: tuple[str, list[int]],
                   load_format: str, quantization: str) -> dict:
    """Everything that changes what a block's K/V is, or its hash: the model (its directory, config.json's
    bytes, its weight files' names, sizes and times), the KV's dtype and shape, the block size, how the
    weights were made (dummy weights are seeded, so they too are the same each start), and the hash
    function (Python's tuple hash, which has changed between versions)."""
    folder = Path(model_dir).resolve()
    config_path = folder / "config.json"
    config_digest = hashlib.sha256(config_path.read_bytes()).hexdigest() if config_path.is_file() else ""
    weights = []
    if folder.is_dir():
        for path in sorted(folder.iterdir()):
            if path.suffix in _WEIGHT_SUFFIXES:
                stat = path.stat()
                weights.append([path.name, stat.st_size, stat.st_mtime_ns])
    return {
        "format": FORMAT_VERSION, "model_dir": str(folder), "config_sha256": config_digest, "weights": weights,
        "dtype": dtype, "block_size": block_size, "kv_dtype": block_layout[0], "kv_block_shape": block_layout[1],
        "load_format": load_format, "quantization": quantization,
        "python": list(sys.version_info[:2]), "hash_probe": hash((1, (2, 3))),
    }


def identity_folder(root: Path, identity: dict, rank: int | None = None) -> Path:
    """`root/<model name>-<16 hex digits of the identity>` (and `rank<N>` under it for a data-parallel engine),
    with the identity written beside the blocks as identity.json, for whoever looks."""
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    folder = root / f"{Path(identity['model_dir']).name}-{digest}"
    if rank is not None:
        folder = folder / f"rank{rank}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "identity.json").write_text(json.dumps(identity, indent=1, sort_keys=True) + "\n")
    return folder


def lock_folder(folder: Path) -> int:
    """An exclusive lock on `folder` for this process's life (its fd); ValueError when another engine holds it."""
    fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise ValueError(f"--kv-cache-disk: {folder} is in use by another engine (one engine per folder; "
                         "give each server its own --kv-cache-disk)") from None
    return fd
