"""A GGUF's 4-bit blocks under `--quantization int4`, repacked as they are rather than quantized again.

Q4_0 (w = d (q - 8)) and Q4_1 (w = d q + m) blocks are int4_linear's format exactly: 32 weights, a float16
scale (and offset: Q4_1's; Q4_0's are symmetric and keep none), the same nibble order. Q4_K's super-blocks of
256 hold 8 blocks of 32 with 6-bit scales and minimums under two float16 factors, w = (d sc) q - (dmin m):
repacked two-level, the codes as bytes and d and dmin as they are, so exactly (until 2026-12-06 d sc and dmin m
were rounded to float16 per block: 5 bits a weight against 4.625 now). Quantizing the dequantized weight again
instead would put each weight on a second grid of its own: lossless only where a block spans its whole
grid, as Q4_1's do; Q4_0's and Q4_K's mostly do not. A linear with a part in a wider quantized type (Q5_*, Q6_K,
Q8_0: what a Q4_K_M file gives attn_v and half the ffn_down, llama.cpp's choice for the layers that lose most
in 4 bits) is int8, as the head is; float types (F16, BF16, F32) are quantized to int4 as any checkpoint's.

Each repacked weight is checked against the one the model loaded from the conversion (gguf_dir.py):
transformers has undone llama.cpp's reordering of a Llama's q and k rows there, which is tried here too,
and Granite's multipliers are folded in at load. A weight that does not match keeps the quantization
from floats, and the log says so.
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from torch import nn

from rill.engine_proc.attention.kv_layout import num_kv_heads_of
from rill.engine_proc.kernels.int4_linear import dequantize_int4, group_params
from rill.engine_proc.model.gguf_reader import read_gguf
from rill.engine_proc.model.llama_weights import RENAMES, fused_shards

log = logging.getLogger("rill.model")
Packed = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (nibbles, scales, offsets): int4_linear's layout


def blocks_to_int4(raw: np.ndarray, qtype) -> Packed | None:
    """Rows of GGUF blocks (uint8 [N, bytes a row]) as (nibbles [N, G * 16], scales and offsets float16
    [N, G]) with G groups of 32 a row, or None for a type that is not 4-bit with blocks of 32."""
    import gguf
    from gguf.quants import Q4_K

    n = raw.shape[0]
    types = gguf.GGMLQuantizationType
    if qtype in (types.Q4_0, types.Q4_1):
        size = 18 if qtype == types.Q4_0 else 20
        blocks = raw.reshape(n, -1, size)
        scales = blocks[..., :2].copy().view(np.float16)[..., 0]
        # Q4_0's symmetric blocks keep no offsets (offset = -8 * scale): a tenth fewer bytes than Q4_1's
        offsets = blocks[..., 2:4].copy().view(np.float16)[..., 0] if qtype == types.Q4_1 else scales[..., :0]
        nibbles = blocks[..., size - 16:]
    elif qtype == types.Q4_K:
        blocks = raw.reshape(-1, 144)  # per super-block: d, dmin, 12 bytes of 6-bit scales and mins, 128 of nibbles
        sc, mins = Q4_K.get_scale_min(blocks[:, 4:16])
        # Two-level, as they are: per row its 8 codes a super-block, then each super-block's d and dmin (4 bytes)
        scales = np.concatenate((sc.astype(np.uint8).reshape(n, -1), blocks[:, :4].reshape(n, -1)), axis=1)
        offsets = mins.astype(np.uint8)
        # 32 bytes per pair of blocks: block 2c's weights in their low nibbles, block 2c + 1's in the high ones.
        qs = blocks[:, 16:].reshape(-1, 4, 1, 32)
        q = np.concatenate((qs & 15, qs >> 4), axis=2).reshape(-1, 32)  # each block's 32 weights in order
        nibbles = q[:, :16] | (q[:, 16:] << 4)  # int4_linear's order: weight j low, weight 16 + j high
    else:
        return None
    nibbles, scales, offsets = (np.ascontiguousarray(a).reshape(n, -1) for a in (nibbles, scales, offsets))
    if nibbles.shape[1] // 16 % 2:  # whole pairs of groups (the VNNI kernel's unit): a zero group after the last
        nibbles = np.pad(nibbles, ((0, 0), (0, 16)))
        scales, offsets = (np.pad(a, ((0, 0), (0, 1 if a.shape[1] else 0))) for a in (scales, offsets))
    return torch.from_numpy(nibbles), torch.from_numpy(scales), torch.from_numpy(offsets)


def llama_cpp_order(num_rows: int, num_heads: int) -> torch.Tensor:
    """The HF row each GGUF row of a Llama's q or k holds: llama.cpp interleaves each head's two rotary halves."""
    return torch.arange(num_rows).view(num_heads, 2, -1).transpose(1, 2).reshape(-1)


def matches(packed: Packed, weight: torch.Tensor) -> bool:
    """Whether the packed weight is `weight` (the model's, maybe rounded to bfloat16) within rounding: Q4_K's
    float16 scales and offsets move a weight by up to about 2^-6 of a step; a wrong row order, by steps."""
    got = dequantize_int4(*packed, weight.shape[1])
    want = weight.float()
    steps = group_params(*packed)[0].abs().repeat_interleave(32, dim=1)[:, :weight.shape[1]]
    return bool(((got - want).abs() <= want.abs() * 2**-7 + steps * 2**-5 + 1e-6).all())


def hf_parts(native: str, config) -> list[tuple[str, int]]:
    """(HF module name, row offset) of each part of native linear `native` ("layers.3.attn.qkv_proj")."""
    prefix, _, leaf = native.rpartition(".")
    prefix, _, owner = prefix.rpartition(".")
    local = f"{owner}.{leaf}"
    parts = [(hf, offset) for hf, (fused, offset, _) in fused_shards(config).items() if fused == local]
    if not parts:
        parts = [(next((hf for hf, n in RENAMES.items() if n == local), local), 0)]
    return [(f"model.{prefix}.{hf}", offset) for hf, offset in parts]


def fused(pieces: list[Packed]) -> Packed:
    """One weight of its parts' rows (q, k and v; gate and up), in their layout where they share one: else each with
    float16 scales and offsets per group (a Q4_K part's d * code and -dmin * code rounded to float16)."""
    kinds = {(p[1].dtype, p[2].shape[1] == 0) for p in pieces}
    if len(kinds) > 1:
        pieces = [(q, *(t.to(torch.float16) for t in group_params(q, s, o))) for q, s, o in pieces]
    return tuple(torch.cat(same).contiguous() for same in zip(*pieces))


FOUR_BIT = ("Q4_0", "Q4_1", "Q4_K")
WIDER = ("Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0", "Q8_1", "Q8_K")  # quantized types wider than 4 bits: int8


def repacked_linears(model: nn.Module, gguf_path: Path) -> tuple[dict[str, Packed], set[str]]:
    """(qualified module name -> packed int4 weight, for each of the native model's linears (not the head)
    whose every part is a 4-bit GGUF tensor that matches the loaded weight; the names of those with a part
    wider than 4 bits, for int8)."""
    import gguf

    reader = read_gguf(gguf_path)
    arch_name = reader.get_field("general.architecture").contents()
    arch = next((a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == arch_name), None)
    if arch is None:
        return {}, set()
    names = gguf.get_tensor_name_map(arch, model.config.num_hidden_layers)
    tensors = {t.name: t for t in reader.tensors}
    config = model.config
    heads = {"q_proj": config.num_attention_heads, "k_proj": num_kv_heads_of(config)}  # llama.cpp reorders these
    # A 4-bit file's wider layers are int8; a Q8_0 file's are int4, as asked.
    mixed = any(t.tensor_type.name in FOUR_BIT for t in reader.tensors if t.name.startswith("blk."))
    out, wider, mismatched = {}, set(), []
    for qualified, module in model.named_modules():
        if type(module) is not nn.Linear or qualified == "lm_head" or not qualified.startswith("layers."):
            continue
        pieces = []
        parts = [(names.get_name(hf + ".weight", try_suffixes=(".weight",)), hf, offset)
                 for hf, offset in hf_parts(qualified, config)]
        if mixed and any(tensors[n].tensor_type.name in WIDER for n, _, _ in parts if n in tensors):
            wider.add(qualified)
            continue
        for gguf_name, hf, offset in parts:
            tensor = tensors.get(gguf_name or "")
            packed = None if tensor is None else blocks_to_int4(np.asarray(tensor.data), tensor.tensor_type)
            if packed is None:
                break
            rows = slice(offset, offset + packed[0].shape[0])
            weight = module.weight.detach()[rows]
            if not matches(packed, weight):
                heads_of = heads.get(hf.rpartition(".")[2])
                order = None if heads_of is None else torch.argsort(llama_cpp_order(packed[0].shape[0], heads_of))
                packed = None if order is None else tuple(t[order] for t in packed)
                if packed is None or not matches(packed, weight):
                    mismatched.append(gguf_name)
                    break
            pieces.append(packed)
        else:
            out[qualified] = fused(pieces)
    if mismatched:
        log.warning("%d 4-bit GGUF tensors differ from the converted weights (%s ...): quantized from floats",
                    len(mismatched), mismatched[0])
    log.info("of the GGUF's linears, %d kept in their 4-bit blocks, %d int8 for their wider types", len(out), len(wider))
    return out, wider
