"""PEFT-layout LoRA adapters written by hand (no PEFT, no base weights) for bench's tiny model, and broken ones."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from rill.bench.serving.tiny_model import TINY_SHAPE

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def tiny_config():
    """The tiny model's config as the engine sees it (a LlamaConfig of TINY_SHAPE)."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=49152, **TINY_SHAPE)


def write_adapter(out_dir: str | Path, seed: int, rank: int = 4, b_std: float = 1.0) -> Path:
    """An adapter on every linear of every layer of the tiny model, random A and B (B non-zero, so
    it changes the output; a large b_std changes it a lot)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hidden, inter = TINY_SHAPE["hidden_size"], TINY_SHAPE["intermediate_size"]
    q_out = TINY_SHAPE["num_attention_heads"] * TINY_SHAPE["head_dim"]
    kv_out = TINY_SHAPE["num_key_value_heads"] * TINY_SHAPE["head_dim"]
    shapes = {"q_proj": (hidden, q_out), "k_proj": (hidden, kv_out), "v_proj": (hidden, kv_out),
              "o_proj": (q_out, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
              "down_proj": (inter, hidden)}
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(TINY_SHAPE["num_hidden_layers"]):
        for module in TARGETS:
            part = "self_attn" if module in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{part}.{module}"
            in_features, out_features = shapes[module]
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, in_features, generator=gen) / in_features**0.5
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out_features, rank, generator=gen) * b_std
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "lora_alpha": rank, "target_modules": list(TARGETS), "bias": "none"}))
    return out


def broken_adapters(root: str | Path) -> dict[str, Path]:
    """Paths that are not servable adapters, each of a kind that once escaped as something other
    than AdapterError (and stopped the engine): kind -> path."""
    root = Path(root)
    good = write_adapter(root / "good", seed=0)
    out = {}

    def copy(kind: str) -> Path:
        path = root / kind
        path.mkdir()
        for f in good.iterdir():
            (path / f.name).write_bytes(f.read_bytes())
        out[kind] = path
        return path

    (copy("config_is_a_list") / "adapter_config.json").write_text("[1, 2, 3]")
    (copy("config_nested_deep") / "adapter_config.json").write_text("[" * 100_000 + "]" * 100_000)
    (copy("config_not_utf8") / "adapter_config.json").write_bytes(b"{\"r\": \xff}")
    (copy("alpha_not_a_number") / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": "sixteen"}))
    weights = copy("truncated_weights") / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    (copy("weights_not_safetensors") / "adapter_model.safetensors").write_bytes(b"\xff" * 64)
    nan = copy("nan_weights") / "adapter_model.safetensors"
    from safetensors.torch import load_file
    tensors = load_file(str(nan))
    next(iter(tensors.values()))[0, 0] = float("nan")
    save_file(tensors, str(nan))
    out["name_too_long"] = root / ("n" * 300)  # ENAMETOOLONG from the first stat()
    a_file = root / "a_file"
    a_file.write_text("not a directory")
    out["path_is_a_file"] = a_file
    out["nested_in_a_file"] = a_file / "adapter"  # ENOTDIR
    return out
