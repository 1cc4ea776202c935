"""What the engine builds for a model directory, chosen once at start: runner, dtype, EOS ids."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from rill.engine_proc.cpu_features import auto_cpu_dtype
from rill.engine_proc.model.config_json import JsonConfig

log = logging.getLogger("rill.engine")


def eos_token_ids(model_dir: Path, config) -> list[int]:
    ids: set[int] = set()
    for eos in (getattr(config, "eos_token_id", None), _generation_config(model_dir).get("eos_token_id")):
        ids.update([eos] if isinstance(eos, int) else (eos or []))
    return sorted(ids)


def _generation_config(model_dir: Path) -> dict:
    """generation_config.json as a JSON object (transformers' GenerationConfig reads the same file, after 1 s of
    imports); empty where there is none."""
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None
    return config if isinstance(config, dict) else {}


def choose_dtype(requested: str, device) -> tuple[str, str]:
    """(dtype name, why): the user's choice, or what `auto` picks for this device and CPU."""
    if requested != "auto":
        return requested, "asked for with --dtype"
    if device.type == "cuda":
        return "bfloat16", "--dtype auto on a GPU"
    return auto_cpu_dtype()


MODEL_IMPLS = ("auto", "native", "transformers")


def choose_runner(model_impl: str, hf_config):
    """The runner class for this model, chosen once at start: native where it supports the
    architecture, else (or when asked) transformers' own model over the paged cache, or, for the
    few it cannot run, one sequence at a time (hf_paged.paged_unsupported says which)."""
    from rill.engine_proc.model.llama import check_supported
    from rill.engine_proc.model.runner import ModelRunner

    if model_impl not in MODEL_IMPLS:
        raise ValueError(f"model_impl {model_impl!r}: expected one of {MODEL_IMPLS}")
    if model_impl == "transformers":
        return _transformers_runner(hf_config, "--model-impl transformers")
    try:
        check_supported(hf_config)
    except ValueError as exc:
        if model_impl == "native":
            raise ValueError(f"--model-impl native: {exc}; use --model-impl auto or transformers") from None
        return _transformers_runner(hf_config, f"no native implementation: {exc}")
    return ModelRunner


def _transformers_runner(hf_config, why: str):
    from rill.engine_proc.model.hf_paged import PagedTransformersRunner, paged_unsupported
    from rill.engine_proc.model.hf_runner import TransformersRunner
    from rill.engine_proc.model.loader import transformers_config

    if isinstance(hf_config, JsonConfig):  # transformers' own models: the config as transformers reads it
        hf_config = transformers_config(hf_config.name_or_path)
    reason = paged_unsupported(hf_config)
    if reason is None:
        log.info("model_type %r: transformers' model over the paged KV cache (%s)", hf_config.model_type, why)
        return PagedTransformersRunner
    log.warning("model_type %r: transformers' model one sequence at a time (%s; the paged route cannot run it: "
                "%s), correct but slower", hf_config.model_type, why, reason)
    return TransformersRunner
