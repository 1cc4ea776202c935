"""A PEFT LoRA adapter (`adapter_config.json` + `adapter_model.safetensors`) read and checked.

Refused with a message naming what is wrong (a 400 at runtime loading, exit 2 at start): not a
directory of PEFT's layout, files that cannot be read, a config that is not a JSON object, a
truncated or corrupt safetensors file, another PEFT type, a rank above --max-lora-rank, a target
module the native Llama-family model does not have, DoRA, trained biases or modules_to_save,
per-module rank or alpha patterns, and weights that are not finite or whose shapes are not the
base model's. Whatever the files hold, loading raises AdapterError and nothing else that a
reader of files can cause (the engine answers anything else with a 500 and goes on).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import SafetensorError, safe_open

from rill.engine_proc.attention.kv_layout import head_dim_of, num_kv_heads_of

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# The linears LoRA may target, by PEFT's module name: where each lies in Rill's fused layers.
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
MAX_CONFIG_BYTES = 1 << 20  # PEFT writes about 1 KB; this is read whole, on the engine's busy loop
_KEY = re.compile(r"layers\.(\d{1,9})\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.[\w-]+)?\.weight$")


class AdapterError(ValueError):
    """An adapter that cannot be served; the message says why."""


@dataclass
class LoRAAdapter:
    name: str
    path: str
    rank: int
    scaling: float  # lora_alpha / r (/ sqrt(r) with use_rslora): folded into B at load
    # Unique per load (LoRAManager numbers them): the prefix cache keys an adapter's blocks by it,
    # so weights loaded again under the same name never meet K/V computed with the old ones.
    load_id: int = 0
    # (layer index, module name) -> (A [r, in], B * scaling [out, r])
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


def module_shapes(config: PretrainedConfig) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each targetable module of the base model."""
    hidden, head_dim = config.hidden_size, head_dim_of(config)
    q_out, kv_out = config.num_attention_heads * head_dim, num_kv_heads_of(config) * head_dim
    inter = config.intermediate_size
    return {"q_proj": (hidden, q_out), "k_proj": (hidden, kv_out), "v_proj": (hidden, kv_out),
            "o_proj": (q_out, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
            "down_proj": (inter, hidden)}


def load_adapter(name: str, path: str | Path, config: PretrainedConfig, max_rank: int) -> LoRAAdapter:
    try:
        return _load(name, Path(path), config, max_rank)
    except OSError as exc:  # no permission, a name too long, a file that is a directory, EIO
        raise AdapterError(f"LoRA adapter {name!r}: cannot read {path}: {exc.strerror or exc}") from None
    except SafetensorError as exc:  # truncated, or not safetensors at all
        raise AdapterError(f"LoRA adapter {name!r}: adapter_model.safetensors is not a valid safetensors "
                           f"file ({exc})") from None
    except AdapterError:
        raise
    except (ValueError, TypeError, RuntimeError) as exc:  # a tensor torch cannot take (its dtype, its size)
        raise AdapterError(f"LoRA adapter {name!r}: its files cannot be loaded ({type(exc).__name__}: {exc})") from None


def _load(name: str, path: Path, config: PretrainedConfig, max_rank: int) -> LoRAAdapter:
    config_file, weights_file = path / "adapter_config.json", path / "adapter_model.safetensors"
    if not config_file.is_file() or not weights_file.is_file():
        raise AdapterError(f"LoRA adapter {name!r}: {path} is not a PEFT adapter directory "
                           "(adapter_config.json and adapter_model.safetensors)")
    peft = _read_config(name, config_file)
    rank = _check_config(name, peft, max_rank)
    alpha = float(peft.get("lora_alpha") or rank)
    scaling = alpha / math.sqrt(rank) if peft.get("use_rslora") else alpha / rank
    adapter = LoRAAdapter(name, str(path), rank, scaling)
    shapes = module_shapes(config)
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    with safe_open(str(weights_file), framework="pt") as f:
        for key in f.keys():
            match = _KEY.search(key)
            if match is None:
                raise AdapterError(f"LoRA adapter {name!r}: weight {key!r} is not a LoRA A or B of a supported module")
            layer, module, which = int(match.group(1)), match.group(2), match.group(3)
            if module not in shapes:
                raise AdapterError(f"LoRA adapter {name!r}: module {module!r} is not supported: {ATTENTION + MLP}")
            if layer >= config.num_hidden_layers:
                raise AdapterError(f"LoRA adapter {name!r}: layer {layer} is past the model's "
                                   f"{config.num_hidden_layers} layers")
            in_features, out_features = shapes[module]
            expected = (rank, in_features) if which == "A" else (out_features, rank)
            if tuple(f.get_slice(key).get_shape()) != expected:  # before reading: its size is the file's word
                raise _shape_error(name, layer, module, rank, in_features, out_features)
            tensor = f.get_tensor(key)
            if not (tensor.is_floating_point() and torch.isfinite(tensor).all()):
                raise AdapterError(f"LoRA adapter {name!r}: weight {key!r} must be floating point and finite")
            pairs.setdefault((layer, module), {})[which] = tensor.float()
    for (layer, module), pair in pairs.items():
        in_features, out_features = shapes[module]
        a, b = pair.get("A"), pair.get("B")
        if a is None or b is None:  # shapes were checked as each was read
            raise _shape_error(name, layer, module, rank, in_features, out_features)
        adapter.weights[(layer, module)] = (a, b * scaling)
    if not adapter.weights:
        raise AdapterError(f"LoRA adapter {name!r}: no LoRA weights in {weights_file}")
    return adapter


def _shape_error(name: str, layer: int, module: str, rank: int, in_features: int, out_features: int) -> AdapterError:
    return AdapterError(f"LoRA adapter {name!r}: layer {layer} {module}: expected A [{rank}, {in_features}] "
                        f"and B [{out_features}, {rank}] for this base model")


def _read_config(name: str, config_file: Path) -> dict:
    """adapter_config.json as a JSON object, or AdapterError."""
    with config_file.open("rb") as f:
        raw = f.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise AdapterError(f"LoRA adapter {name!r}: adapter_config.json is over {MAX_CONFIG_BYTES} bytes")
    try:
        peft = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, or nested past the parser's depth
        raise AdapterError(f"LoRA adapter {name!r}: adapter_config.json is not JSON ({exc})") from None
    if not isinstance(peft, dict):
        raise AdapterError(f"LoRA adapter {name!r}: adapter_config.json must be a JSON object, "
                           f"not {type(peft).__name__}")
    return peft


def _check_config(name: str, peft: dict, max_rank: int) -> int:
    if peft.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"LoRA adapter {name!r}: peft_type {peft.get('peft_type')!r} is not LORA")
    rank = peft.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise AdapterError(f"LoRA adapter {name!r}: r must be a positive integer")
    alpha = peft.get("lora_alpha")
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, int | float) or not math.isfinite(alpha)):
        raise AdapterError(f"LoRA adapter {name!r}: lora_alpha must be a number")
    if rank > max_rank:
        raise AdapterError(f"LoRA adapter {name!r}: rank {rank} is above --max-lora-rank {max_rank}")
    if peft.get("use_dora"):
        raise AdapterError(f"LoRA adapter {name!r}: DoRA (use_dora) is not supported")
    if peft.get("bias", "none") != "none" or peft.get("modules_to_save"):
        raise AdapterError(f"LoRA adapter {name!r}: trained biases and modules_to_save are not supported")
    if peft.get("rank_pattern") or peft.get("alpha_pattern"):
        raise AdapterError(f"LoRA adapter {name!r}: per-module rank_pattern and alpha_pattern are not supported")
    return rank
