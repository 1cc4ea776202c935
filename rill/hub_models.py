"""A Hugging Face model id (`Qwen/Qwen2.5-1.5B-Instruct`), as `vllm serve` takes it, found in the local Hugging
Face cache that vLLM, transformers and `hf download` fill (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
~/.cache/huggingface/hub; or vLLM's `--download-dir`). Nothing is downloaded: a model not in the cache is an
error that says how to fetch it."""
from __future__ import annotations

import re
from pathlib import Path

# A hub id: an optional owner and a name, of the characters the hub allows (a local path is tried first).
_REPO_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}$")


def looks_like_repo_id(name: str) -> bool:
    return bool(_REPO_ID.match(name)) and ".." not in name and not name.endswith(".gguf")


def cached_snapshot(repo_id: str, revision: str | None = None, cache_dir: str | None = None) -> Path:
    """The cached snapshot folder of `repo_id` at `revision` (a branch, tag or commit; default `main`);
    FileNotFoundError, saying where it looked and how to fetch it, when the cache lacks it."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.constants import HF_HUB_CACHE
    from huggingface_hub.errors import LocalEntryNotFoundError

    where = cache_dir or HF_HUB_CACHE
    try:
        folder = Path(snapshot_download(repo_id, revision=revision, cache_dir=cache_dir, local_files_only=True))
    except (LocalEntryNotFoundError, ValueError, OSError):
        folder = None
    if folder is None or not (folder / "config.json").is_file():
        at = f" at revision {revision}" if revision else ""
        raise FileNotFoundError(f"not a local model directory or GGUF file, and not in the Hugging Face cache "
                                f"({where}){at}; Rill never downloads models: fetch it first with "
                                f"`hf download {repo_id}`")
    return folder
