"""Hugging Face checkpoint tensors into the native Llama: fused q/k/v and gate/up, a rank's shard."""
from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from rill.engine_proc.attention.kv_layout import head_dim_of, num_kv_heads_of

RENAMES = {
    "self_attn.o_proj": "attn.o_proj",
    "self_attn.q_norm": "attn.q_norm",
    "self_attn.k_norm": "attn.k_norm",
    "input_layernorm": "input_norm",
    "post_attention_layernorm": "post_attn_norm",
}


def fused_shards(config) -> dict[str, tuple[str, int, int]]:
    """HF leaf -> (native leaf, row offset, row count) inside the fused weight, for the sizes of
    `config` (a tensor-parallel rank's local config: its heads, its MLP width)."""
    head_dim = head_dim_of(config)
    q_dim, kv_dim = config.num_attention_heads * head_dim, num_kv_heads_of(config) * head_dim
    intermediate = config.intermediate_size
    return {
        "self_attn.q_proj": ("attn.qkv_proj", 0, q_dim),
        "self_attn.k_proj": ("attn.qkv_proj", q_dim, kv_dim),
        "self_attn.v_proj": ("attn.qkv_proj", q_dim + kv_dim, kv_dim),
        "mlp.gate_proj": ("mlp.gate_up_proj", 0, intermediate),
        "mlp.up_proj": ("mlp.gate_up_proj", intermediate, intermediate),
    }


def split_fused(weights: Iterable[tuple[str, torch.Tensor]], config) -> Iterable[tuple[str, torch.Tensor]]:
    """Phi-3's checkpoint fuses q/k/v (`qkv_proj`) and gate/up (`gate_up_proj`): its tensors as a
    Llama's, so that a rank's slice and the fused weights are found as for any other. `config`: the
    whole model's."""
    rows = {hf_part: count for hf_part, (_, _, count) in fused_shards(config).items()}
    qkv, gate_up = ("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")
    for name, tensor in weights:
        if ".self_attn.qkv_proj." in name:
            parts = zip(qkv, tensor.split([rows[f"self_attn.{part}"] for part in qkv]))
            yield from ((name.replace("qkv_proj", part), t) for part, t in parts)
        elif ".mlp.gate_up_proj." in name:
            parts = zip(gate_up, tensor.split([rows[f"mlp.{part}"] for part in gate_up]))
            yield from ((name.replace("gate_up_proj", part), t) for part, t in parts)
        else:
            yield name, tensor


def load_weights(model, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy Hugging Face-named tensors into `model` (its rank's slice of each under tensor
    parallelism, engine_proc/parallel/sharding.py); fail on a missing or misshapen one."""
    weights = split_fused(weights, model.shard.config if model.shard is not None else model.config)
    params = dict(model.named_parameters())
    loaded: set[tuple[str, int | None]] = set()
    shards = fused_shards(model.config)
    shard = model.shard
    for hf_name, tensor in weights:
        name = hf_name.removeprefix("model.")
        if "rotary_emb." in name or (name == "lm_head.weight" and model.tie_word_embeddings):
            continue  # recomputed here / tied to the embedding
        if shard is not None:
            if name == "embed_tokens.weight" and model.tie_word_embeddings:
                _copy(params, "lm_head.weight", (None, None), shard.head_rows(tensor), hf_name, loaded)
            elif name == "lm_head.weight":
                tensor = shard.head_rows(tensor)
            else:
                tensor = shard.slice(name, tensor)
        target, offset, num_rows = _native_name(name, shards)
        _copy(params, target, (offset, num_rows), tensor, hf_name, loaded)
    expected = set()
    for param_name in params:
        module_path = param_name.rpartition(".")[0]
        offsets = [off for native, off, _ in shards.values() if module_path.endswith(native)]
        expected.update((param_name, off) for off in (offsets or [None]))
    missing = sorted({name for name, _ in expected - loaded})
    if missing:
        more = " ..." if len(missing) > 8 else ""
        raise ValueError(f"weights missing from the checkpoint: {missing[:8]}{more}")


def _native_name(name: str, shards) -> tuple[str, int | None, int | None]:
    """(native parameter name, row offset and count inside a fused weight or None) of an HF name."""
    module_path, _, leaf = name.rpartition(".")  # leaf: weight or bias
    for hf_part, (native_part, row_offset, row_count) in shards.items():
        if module_path.endswith(hf_part):
            return f"{module_path.removesuffix(hf_part) + native_part}.{leaf}", row_offset, row_count
    for hf_part, native_part in RENAMES.items():
        if module_path.endswith(hf_part):
            return f"{module_path.removesuffix(hf_part) + native_part}.{leaf}", None, None
    return name, None, None


def _copy(params, param_name: str, rows: tuple[int | None, int | None], tensor: torch.Tensor, hf_name: str,
          loaded: set) -> None:
    if param_name not in params:
        raise ValueError(f"unexpected weight {hf_name!r} (no parameter {param_name!r})")
    dest = params[param_name].data
    offset, num_rows = rows
    if offset is not None:
        dest = dest.narrow(0, offset, num_rows)
    if dest.shape != tensor.shape:
        raise ValueError(f"weight {hf_name!r} has shape {tuple(tensor.shape)}, expected {tuple(dest.shape)}")
    dest.copy_(tensor)
    loaded.add((param_name, offset))


def init_dummy_weights(model, seed: int = 0) -> None:
    """Small random weights (normal, std = initializer_range), unit norms: finite activations.
    The same on every tensor-parallel rank, each its own shape (a test's model, not a shard of one)."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    std = getattr(model.config, "initializer_range", 0.02)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.data.fill_(1.0)
        elif name.endswith(".bias"):
            param.data.zero_()
        else:
            values = torch.empty(param.shape, dtype=torch.float32)
            param.data.copy_(values.normal_(0.0, std, generator=generator))


def multiplier(config, name: str) -> float:
    """One of Granite's scalars (`embedding_multiplier`, `residual_multiplier`, `logits_scaling`); 1
    where the config has none."""
    return float(getattr(config, name, None) or 1.0)


def has_multipliers(config) -> bool:
    """Whether the config scales what a Llama does not (Granite's multipliers, fold_multipliers)."""
    if getattr(config, "attention_multiplier", None) is not None:  # a softmax scale: 1.0 is one too
        return True
    return any(multiplier(config, name) != 1.0
               for name in ("embedding_multiplier", "residual_multiplier", "logits_scaling"))


@torch.no_grad()
def fold_multipliers(model) -> None:
    """Granite's scalars into the weights they multiply, once after loading (before any packing or
    quantization): `embedding_multiplier` into the embedding, `residual_multiplier` into o_proj and
    down_proj (each residual branch ends there), and `attention_multiplier`, Granite's softmax scale
    in place of 1/sqrt(head_dim), into q's rows of qkv_proj (RoPE is linear). `logits_scaling` is the
    model's head_scale. A no-op for a config without them."""
    config = model.config
    embedding, residual = multiplier(config, "embedding_multiplier"), multiplier(config, "residual_multiplier")
    attention = getattr(config, "attention_multiplier", None)
    if embedding != 1.0:
        model.embed_tokens.weight.mul_(embedding)
    for layer in model.layers:
        head_dim = layer.attn.head_dim
        q_scale = 1.0 if attention is None else float(attention) * math.sqrt(head_dim)
        for linear, rows, factor in ((layer.attn.o_proj, None, residual), (layer.mlp.down_proj, None, residual),
                                     (layer.attn.qkv_proj, layer.attn.num_heads * head_dim, q_scale)):
            for param in (linear.weight, linear.bias) if factor != 1.0 else ():
                if param is not None:
                    param[:rows].mul_(factor)  # rows None: the whole tensor
