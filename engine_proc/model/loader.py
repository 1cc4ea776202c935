"""Loads a model directory (config, safetensors weights) into the native model, packed for the CPU."""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import safe_open

from rill.engine_proc.attention.backend import AttentionBackend
from rill.engine_proc.kernels.linear import pack_linears_for_cpu
from rill.engine_proc.kernels.quantization import check_quantization, quantize_linears
from rill.engine_proc.model.config_json import JsonConfig, read_config_json
from rill.engine_proc.model.llama import LlamaForCausalLM
from rill.engine_proc.model.memory import empty_like_on
from rill.engine_proc.parallel.sharding import Shard
from rill.ipc.logs import route_transformers_logs

if TYPE_CHECKING:
    from transformers import PretrainedConfig

log = logging.getLogger("rill.model")

LOAD_FORMATS = ("auto", "safetensors", "dummy")


def load_config(model_dir: str | Path) -> PretrainedConfig | JsonConfig:
    """The Hugging Face config of a local directory (never a hub name: nothing is downloaded): read from its
    config.json where a plain native family's is (config_json.py), else by transformers."""
    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} has no config.json (give a local Hugging Face model directory)")
    return read_config_json(path) or transformers_config(path)


def transformers_config(model_dir: str | Path) -> PretrainedConfig:
    """The config as transformers reads it, for its own models and where config_json.py leaves it."""
    from transformers import AutoConfig

    route_transformers_logs()
    return AutoConfig.from_pretrained(str(model_dir), local_files_only=True)


def safetensors_files(model_dir: str | Path) -> list[Path]:
    path = Path(model_dir)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        with open(index) as f:
            return [path / name for name in sorted(set(json.load(f)["weight_map"].values()))]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path} has no *.safetensors weights (convert .bin checkpoints first)")
    return files


def iter_safetensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """One tensor at a time (memory-mapped), so loading never holds two copies of the model."""
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def load_model(
    model_dir: str | Path,
    config: PretrainedConfig,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    load_format: str = "auto",
    quantization: str = "none",
    int4_group_size: int = 32,
    int4_symmetric: bool = False,
    shard: Shard | None = None,
    batch_invariant: bool = False,
    attention: AttentionBackend | None = None,
) -> LlamaForCausalLM:
    """The native model with its weights: from safetensors, or random ("dummy") for a config.

    `quantization="int8"` stores every linear layer and the head as int8 (engine_proc/kernels/int8_linear.py);
    "int4", the linears in 4 bits, in groups of `int4_group_size`, `int4_symmetric` or not (kernels/int4_linear.py).
    `shard`: only a tensor-parallel rank's part (engine_proc/parallel/sharding.py).
    `attention`: the runner's attention backend (engine_proc/attention/choice.py; torch when None).
    """
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format {load_format!r}: expected one of {LOAD_FORMATS}")
    check_quantization(quantization, torch.device(device), int4_group_size, int4_symmetric)
    start_s = time.monotonic()
    # Built on the meta device, then given real storage once: no time spent on an
    # initialisation that the checkpoint overwrites anyway.
    with torch.device("meta"):
        model = LlamaForCausalLM(config, shard, attention)
    model = empty_like_on(model, dtype, device)
    model.inv_freq = model.inv_freq.to(device)
    if load_format == "dummy":
        model.init_dummy_weights()
    else:
        model.load_weights(iter_safetensors(safetensors_files(model_dir)))
    model.eval().requires_grad_(False)
    if quantization != "none":
        num_quantized = quantize_linears(model, quantization, *_gguf_blocks(model, model_dir, quantization, shard),
                                         group_size=int4_group_size, symmetric=int4_symmetric)
        log.info("%s weights for %d linear layers, the head included", quantization, num_quantized)
    elif torch.device(device).type == "cpu":
        pack_linears_for_cpu(model, batch_invariant)
    model.bind_kernels()  # the kernel paths, chosen once for the layers as loaded
    log.info("loaded %s (%s, %s, quantization %s) in %.1f s", model_dir, load_format, dtype, quantization,
             time.monotonic() - start_s)
    return model


def _gguf_blocks(model, model_dir, quantization: str, shard) -> tuple[dict, set]:
    """A converted GGUF's 4-bit blocks for int4, and its linears of wider types (model/gguf_int4.py); none for a
    tensor-parallel rank, whose weights are slices."""
    from rill.engine_proc.model.gguf_dir import source_gguf

    gguf_path = source_gguf(model_dir) if quantization == "int4" and shard is None and model_dir else None
    if gguf_path is None:
        return {}, set()
    from rill.engine_proc.model.gguf_int4 import repacked_linears

    return repacked_linears(model, gguf_path)
