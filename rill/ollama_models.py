"""A model Ollama pulled, served from Ollama's own store: `rill serve ollama:llama3.2` (or `ollama://NAME[:TAG]`).
Ollama keeps a model's GGUF as a content-addressed blob named by a manifest
(`$OLLAMA_MODELS`, else ~/.ollama/models: manifests/registry.ollama.ai/library/NAME/TAG, then blobs/sha256-HEX);
the blob is read as any GGUF file is (engine_proc/model/gguf_dir.py), converted once into Rill's cache. Nothing is
downloaded: a model not in the store is an error that says to `ollama pull` it."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

PREFIXES = ("ollama://", "ollama:")
MODEL_LAYER = "application/vnd.ollama.image.model"
DEFAULT_REGISTRY, DEFAULT_NAMESPACE, DEFAULT_TAG = "registry.ollama.ai", "library", "latest"
_PART = re.compile(r"^[A-Za-z0-9][\w.-]{0,127}$")  # one segment of a name or a tag: no path can be spelled
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def ollama_name(model: str) -> str | None:
    """The Ollama name `model` spells (`ollama:llama3.2:1b`), or None for any other model argument."""
    return next((model[len(p):] for p in PREFIXES if model.startswith(p)), None)


def models_dir() -> Path:
    return Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models").expanduser()


def ollama_blob(name: str, store: Path | None = None) -> Path:
    """The GGUF blob of Ollama's `name` ([registry/][namespace/]model[:tag]); FileNotFoundError or ValueError,
    saying why, for a name that is not one, not pulled, or whose manifest names no model layer."""
    store = store or models_dir()
    base, _, tag = name.partition(":")
    parts = base.split("/") if base else []
    tag = tag or DEFAULT_TAG
    if not 1 <= len(parts) <= 3 or not all(_PART.match(p) for p in [*parts, tag]):
        raise ValueError(f"{name!r} is not an Ollama model name ([registry/][namespace/]model[:tag])")
    parts = [*([DEFAULT_REGISTRY, DEFAULT_NAMESPACE][: 3 - len(parts)]), *parts]
    manifest = store.joinpath("manifests", *parts, tag)
    if not manifest.is_file():
        raise FileNotFoundError(f"{name} is not in Ollama's store ({store}); Rill never downloads models: "
                                f"`ollama pull {name}` first, or set OLLAMA_MODELS to the store that holds it")
    try:
        layers = json.loads(manifest.read_text()).get("layers") or []
    except (OSError, ValueError, AttributeError):
        raise ValueError(f"{manifest}: not an Ollama manifest") from None
    digests = [layer.get("digest") for layer in layers if isinstance(layer, dict) and layer.get("mediaType") == MODEL_LAYER]
    if not digests or not isinstance(digests[0], str) or not _DIGEST.match(digests[0]):
        raise ValueError(f"{manifest}: names no model layer (GGUF weights)")
    blob = store / "blobs" / digests[0].replace(":", "-")
    if not blob.is_file():
        raise FileNotFoundError(f"{blob}: the model layer of {name} is missing from Ollama's store")
    return blob
