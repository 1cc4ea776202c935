"""`--model FILE.gguf`: a GGUF file converted once into a Hugging Face directory in the cache.

transformers reads the file (its GGUF loader: the architecture's config, the weights dequantized
to float32, the tokenizer with its special tokens and chat template) and Rill writes what it read
as a safetensors directory, which every route serves as it serves any other. The directory is
named after the file and a key of its path, size and modification time: a changed file converts
again, and the conversion happens once whatever the number of engines starting together (a lock,
then an atomic rename). A split file (`-00001-of-0000N.gguf`) is named by its first part, whose reader shows
transformers every part's tensors (gguf_reader.py); its key covers every part.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path

from rill.engine_proc.model.cache_lock import cache_lock
from rill.engine_proc.model.gguf_reader import SPLIT, read_gguf, split_parts

# What a conversion writes: a new one when this changes (2: general.sampling.* into generation_config.json;
# 3: SOURCE_FILE_NAME).
CONVERSION = 3
log = logging.getLogger("rill.model")

# Present only in a finished directory: everything is written before the final rename.
SOURCE_FILE_NAME = "rill_gguf.json"  # the GGUF converted: --quantization int4 keeps its 4-bit blocks (gguf_int4.py)
REQUIRED_FILE_NAMES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", SOURCE_FILE_NAME)


def is_complete(model_dir: Path) -> bool:
    return all((model_dir / name).is_file() for name in REQUIRED_FILE_NAMES)


def ensure_gguf_model(gguf_path: Path, cache_dir: Path) -> Path:
    """The converted directory of `gguf_path` under `cache_dir`/gguf, converting it on first use."""
    gguf_path = gguf_path.resolve()
    parts = [gguf_path]
    if (split := SPLIT.search(gguf_path.name)) and int(split.group(2)) > 1:
        if int(split.group(1)) != 1:
            raise ValueError(f"{gguf_path.name} is one part of a split GGUF: pass its first part, "
                             f"{gguf_path.name[:split.start()]}-00001-of-{split.group(2)}.gguf")
        parts = split_parts(gguf_path)
    stats = "\n".join(f"{(stat := part.stat()).st_size}\n{stat.st_mtime_ns}" for part in parts)
    key = hashlib.sha256(f"{CONVERSION}\n{gguf_path}\n{stats}".encode()).hexdigest()[:12]
    return ensure_converted(gguf_path, cache_dir / "gguf" / f"{gguf_path.stem}-{key}")


def ensure_converted(gguf_path: Path, target: Path, dtype: str = "float32") -> Path:
    """`target`, converted from `gguf_path` unless it is complete already."""
    if is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{target.name}.tmp-"
    # The lock only saves a second process from converting too; correctness comes from the atomic
    # rename, so a lock left by a dead process (flock dies with it) is harmless.
    with cache_lock(target.parent / f".{target.name}.lock"):
        if is_complete(target):
            return target
        _remove_stale_tmp_dirs(target.parent, prefix)
        tmp = target.parent / f"{prefix}{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        log.info("Converting %s once to %s ...", gguf_path.name, target)
        start_s = time.monotonic()
        try:
            convert(gguf_path, tmp, dtype)
            if target.exists():  # a half directory from an older, non-atomic writer: replace it
                shutil.rmtree(target)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        log.info("done in %.1f s", time.monotonic() - start_s)
    return target


def convert(gguf_path: Path, out_dir: Path, dtype: str = "float32") -> None:
    """The GGUF's model, tokenizer and chat template as a safetensors directory."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_dir, gguf_name = str(gguf_path.parent), gguf_path.name
    with _one_reader():
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=getattr(torch, dtype))
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
        sampling = gguf_sampling(gguf_path)
    # A GGUF-loaded model carries a quantizer and a quantization_config; save_pretrained refuses to
    # write it until both are gone (the weights are already dequantized).
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir, safe_serialization=True)
    if model.generation_config is not None:
        model.generation_config.save_pretrained(out_dir)
    if sampling:  # served as the model's defaults; written as they are (transformers
        path = out_dir / "generation_config.json"  # refuses to save a temperature without do_sample)
        fields = json.loads(path.read_text()) if path.exists() else {}
        path.write_text(json.dumps({**fields, **sampling}, indent=2) + "\n")
    write_source(out_dir, gguf_path)
    if not tokenizer.chat_template:
        log.warning("%s carries no chat template: /v1/chat/completions needs --chat-template", gguf_name)
    # The template goes into tokenizer_config.json (not chat_template.jinja): the API process reads
    # it from there and renders it with its own jinja2 sandbox.
    tokenizer.save_pretrained(out_dir, save_jinja_files=False)
    with open(out_dir / "tokenizer_config.json") as f:
        if tokenizer.chat_template and not json.load(f).get("chat_template"):
            raise RuntimeError("the chat template did not reach tokenizer_config.json")


def write_source(model_dir: Path, gguf_path: Path) -> None:
    """Name `gguf_path` as the file `model_dir` was converted from (written whole: readers never see half)."""
    tmp = Path(model_dir) / f".{SOURCE_FILE_NAME}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps({"gguf": str(gguf_path), "size": gguf_path.stat().st_size}) + "\n")
    os.replace(tmp, Path(model_dir) / SOURCE_FILE_NAME)


def _source_record(model_dir: Path) -> dict:
    try:
        record = json.loads((Path(model_dir) / SOURCE_FILE_NAME).read_text())
        return record if isinstance(record, dict) and isinstance(record.get("gguf"), str) else {}
    except (OSError, ValueError):
        return {}


def source_gguf(model_dir: Path) -> Path | None:
    """The GGUF file `model_dir` was converted from, where it is one and the file is still there."""
    path = Path(record["gguf"]) if (record := _source_record(model_dir)) else None
    return path if path is not None and path.is_file() else None


def follow_source(model_dir: Path, gguf_path: Path) -> bool:
    """Point `model_dir` at `gguf_path` where it was converted from a file of that name and size elsewhere
    (the bundled model's cache outlives the checkout or virtual environment that filled it). False where
    the file is another: the directory needs converting again."""
    gguf_path = gguf_path.resolve()
    record = _source_record(model_dir)
    if record and Path(record["gguf"]) == gguf_path:
        return True
    if not record or Path(record["gguf"]).name != gguf_path.name or record.get("size") != gguf_path.stat().st_size:
        return False
    write_source(model_dir, gguf_path)
    return True


# general.sampling.* (llama.cpp's names) -> generation_config.json's
GGUF_SAMPLING = {"general.sampling.temp": "temperature", "general.sampling.top_p": "top_p",
                 "general.sampling.top_k": "top_k", "general.sampling.min_p": "min_p",
                 "general.sampling.penalty_repeat": "repetition_penalty"}


def gguf_sampling(gguf_path: Path) -> dict[str, float | int]:
    """The GGUF's sampling defaults, under generation_config.json's names (the API applies them where a
    request leaves a field out: asgi/requests/sampling_defaults.py)."""
    import gguf  # its GGUFReader: within convert(), _one_reader's (the file parsed once)

    reader = gguf.GGUFReader(str(gguf_path))
    found = {}
    for key, name in GGUF_SAMPLING.items():
        field = reader.get_field(key)
        if field is not None and field.types and field.types[0] != gguf.GGUFValueType.ARRAY:
            found[name] = field.contents()
    return found


@contextlib.contextmanager
def _one_reader():
    """transformers parses the file once for the config, once for the weights and once for the
    tokenizer, and gguf_sampling once more: within this block each path is parsed once, by Rill's faster
    reader (gguf_reader.py: 0.25 s for a 49152-token vocabulary, 3.7 s with gguf's own). Its weights' name
    map is built once too: transformers asks gguf for it at each of the model's modules (397 for the bundled
    model), and gguf builds it anew from every architecture's names each time (8 s of a 20 s conversion)."""
    import gguf

    readers: dict[str, gguf.GGUFReader] = {}
    original, original_map = gguf.GGUFReader, gguf.get_tensor_name_map

    def shared(path, *args, **kwargs):
        key = str(Path(path).resolve())
        if key not in readers:
            readers[key] = read_gguf(path)
        return readers[key]

    gguf.GGUFReader = shared
    gguf.get_tensor_name_map = functools.cache(original_map)  # (architecture, blocks) -> a map only read
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = original, original_map


def _remove_stale_tmp_dirs(parent: Path, prefix: str) -> None:
    """Delete temp directories whose converting process has died (a crash mid-way)."""
    for path in parent.glob(f"{prefix}*"):
        try:
            pid = int(path.name[len(prefix):])
            os.kill(pid, 0)
        except ValueError:
            continue
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:
            continue  # alive, another user's
