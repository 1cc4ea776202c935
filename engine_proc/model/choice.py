"""What the engine builds for a model directory, chosen once at start: runner, dtype, EOS ids."""
from __future__ import annotations

import logging
from pathlib import Path

from rill.engine_proc.cpu_features import auto_cpu_dtype

log = logging.getLogger("rill.engine")


def eos_token_ids(model_dir: Path, config) -> list[int]:
    ids: set[int] = set()
    for source in (config, _generation_config(model_dir)):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        ids.update([eos] if isinstance(eos, int) else (eos or []))
    return sorted(ids)


def _generation_config(model_dir: Path):
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(model_dir)
    except OSError:
        return None


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

    reason = paged_unsupported(hf_config)
    if reason is None:
        log.info("model_type %r: transformers' model over the paged KV cache (%s)", hf_config.model_type, why)
        return PagedTransformersRunner
    log.warning("model_type %r: transformers' model one sequence at a time (%s; the paged route cannot run it: "
                "%s), correct but slower", hf_config.model_type, why, reason)
    return TransformersRunner
