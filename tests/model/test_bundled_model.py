"""The bundled SmolLM2 model: converted once from its GGUF into a loadable directory."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from rill.engine_proc.model import bundled as bundled_model
from rill.engine_proc.model import gguf_dir
from rill.engine_proc.model.bundled import ensure_bundled_model
from rill.engine_proc.model.loader import load_config


@pytest.fixture(scope="session")
def model_dir() -> Path:
    # The default cache: the conversion (about half a minute) happens once per machine.
    return ensure_bundled_model()


def test_directory_has_config_weights_tokenizer_and_template(model_dir):
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (model_dir / name).is_file(), name
    config = load_config(model_dir)
    assert config.model_type == "llama"
    assert config.tie_word_embeddings
    with open(model_dir / "tokenizer_config.json") as f:
        template = json.load(f)["chat_template"]
    assert "<|im_start|>" in template and "<|im_end|>" in template  # ChatML
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert tokenizer.token_to_id("<|im_end|>") == 2  # eos


def test_second_call_returns_the_directory_without_rewriting(model_dir):
    weights = model_dir / "model.safetensors"
    mtimes_before = (model_dir.stat().st_mtime_ns, weights.stat().st_mtime_ns)
    assert ensure_bundled_model() == model_dir
    assert (model_dir.stat().st_mtime_ns, weights.stat().st_mtime_ns) == mtimes_before


def test_cache_dir_comes_from_rill_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("RILL_CACHE", str(tmp_path))
    assert bundled_model.default_cache_dir() == tmp_path
    monkeypatch.delenv("RILL_CACHE")
    assert bundled_model.default_cache_dir() == Path.home() / ".cache" / "rill"


def test_a_crashed_conversion_leaves_nothing_that_counts(tmp_path):
    """A temp directory of a dead converter is neither used nor kept; a live one's is kept."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    prefix = f".{bundled_model.BUNDLED_DIR_NAME}.tmp-"  # gguf_dir.ensure_converted's
    dead_tmp = tmp_path / f"{prefix}{dead.pid}"
    live_tmp = tmp_path / f"{prefix}{os.getpid()}"
    for path in (dead_tmp, live_tmp):
        path.mkdir()
        (path / "config.json").write_text("{}")
    half = tmp_path / bundled_model.BUNDLED_DIR_NAME
    half.mkdir()
    (half / "config.json").write_text("{}")
    assert not gguf_dir.is_complete(half)
    gguf_dir._remove_stale_tmp_dirs(tmp_path, prefix)
    assert not dead_tmp.exists()
    assert live_tmp.exists()


def _copy_of(model_dir: Path, cache: Path) -> Path:
    """The converted directory under another cache, its large files linked, not copied."""
    copy = cache / bundled_model.BUNDLED_DIR_NAME
    copy.mkdir(parents=True)
    for path in model_dir.iterdir():
        if path.name == gguf_dir.SOURCE_FILE_NAME:
            continue
        os.symlink(path, copy / path.name)
    return copy


def test_a_cache_filled_from_another_install_follows_the_bundled_file_it_was_made_from(model_dir, tmp_path):
    """The cache outlives the checkout or virtual environment that filled it: the same file (name, size)
    moved is followed; another file is converted again."""
    gguf = bundled_model.bundled_gguf_path()
    copy = _copy_of(model_dir, tmp_path)
    moved = tmp_path / "old-venv" / gguf.name
    moved.parent.mkdir()
    os.symlink(gguf, moved)
    gguf_dir.write_source(copy, moved)
    assert gguf_dir.source_gguf(copy) == moved
    assert ensure_bundled_model(tmp_path) == copy and gguf_dir.source_gguf(copy) == gguf.resolve()
    moved.unlink()
    moved.write_bytes(b"another file, another size")
    gguf_dir.write_source(copy, moved)
    assert not gguf_dir.follow_source(copy, gguf)
