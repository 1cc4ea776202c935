"""A PEFT LoRA adapter (`adapter_config.json` + `adapter_model.safetensors`) read and checked.

Refused with a message naming what is wrong (a 400 at runtime loading, exit 2 at start): not a
directory of PEFT's layout, another PEFT type, a rank above --max-lora-rank, a target module the
native Llama-family model does not have, DoRA, trained biases or modules_to_save, per-module
rank or alpha patterns, and weights whose shapes are not the base model's.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import PretrainedConfig

from engine_proc.attention.kv_cache import head_dim_of, num_kv_heads_of

# The linears LoRA may target, by PEFT's module name: where each lies in Rill's fused layers.
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.[\w-]+)?\.weight$")


class AdapterError(ValueError):
    """An adapter that cannot be served; the message says why."""


@dataclass
class LoRAAdapter:
    name: str
    path: str
    rank: int
    scaling: float  # lora_alpha / r (/ sqrt(r) with use_rslora): folded into B at load
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
    path = Path(path)
    config_file, weights_file = path / "adapter_config.json", path / "adapter_model.safetensors"
    if not config_file.is_file() or not weights_file.is_file():
        raise AdapterError(f"LoRA adapter {name!r}: {path} is not a PEFT adapter directory "
                           "(adapter_config.json and adapter_model.safetensors)")
    try:
        peft = json.loads(config_file.read_text())
    except json.JSONDecodeError as exc:
        raise AdapterError(f"LoRA adapter {name!r}: adapter_config.json is not JSON ({exc})") from None
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
            pairs.setdefault((layer, module), {})[which] = f.get_tensor(key).float()
    for (layer, module), pair in pairs.items():
        in_features, out_features = shapes[module]
        a, b = pair.get("A"), pair.get("B")
        if a is None or b is None or a.shape != (rank, in_features) or b.shape != (out_features, rank):
            raise AdapterError(f"LoRA adapter {name!r}: layer {layer} {module}: expected A [{rank}, {in_features}] "
                               f"and B [{out_features}, {rank}] for this base model")
        adapter.weights[(layer, module)] = (a, b * scaling)
    if not adapter.weights:
        raise AdapterError(f"LoRA adapter {name!r}: no LoRA weights in {weights_file}")
    return adapter


def _check_config(name: str, peft: dict, max_rank: int) -> int:
    if peft.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"LoRA adapter {name!r}: peft_type {peft.get('peft_type')!r} is not LORA")
    rank = peft.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise AdapterError(f"LoRA adapter {name!r}: r must be a positive integer")
    if rank > max_rank:
        raise AdapterError(f"LoRA adapter {name!r}: rank {rank} is above --max-lora-rank {max_rank}")
    if peft.get("use_dora"):
        raise AdapterError(f"LoRA adapter {name!r}: DoRA (use_dora) is not supported")
    if peft.get("bias", "none") != "none" or peft.get("modules_to_save"):
        raise AdapterError(f"LoRA adapter {name!r}: trained biases and modules_to_save are not supported")
    if peft.get("rank_pattern") or peft.get("alpha_pattern"):
        raise AdapterError(f"LoRA adapter {name!r}: per-module rank_pattern and alpha_pattern are not supported")
    return rank
