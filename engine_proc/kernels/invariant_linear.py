"""Batch-invariant linear layers: every matmul runs on row tiles of one fixed size.

oneDNN picks a GEMM kernel (its blocking of the reduction, AMX or AVX-512, how it splits the
work) from the number of rows, and the choice differs by CPU: measured on a Sapphire Rapids,
a float32 576 x 1536 projection gives a row other bits at 2 rows than at 1, and a bfloat16 head
changes from 64 rows up; on a Zen 4 other shapes move. So a request's logits would depend on
how many other tokens share its step. Here the step's rows are cut into tiles of `tile_rows`,
the last one padded with zeros, and each tile is one call of the same inner layer: every call
has the same shape, so the same kernel, and a row's result does not depend on its neighbours
(GEMM kernels reduce each output on its own; the tiles are checked to keep that, whatever the
row's place in its tile, by tests/model/test_batch_invariant.py). One call over all tiles at once
(a batched matmul) does not keep it: measured, bmm's result depends on the number of tiles.

The cost is the padding (a decode of 1 row computes `tile_rows`) and one call per tile (a
512-token prefill is 512 / tile_rows calls per layer); bench/kernels/engine_step.py measures it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# Rows per matmul call: the padding costs small batches, the calls per tile cost large ones.
# Measured (bench.kernels.engine_step, bfloat16, Sapphire Rapids), decode time over the default at
# batch 1/8/32: 8 rows 1.23/1.21/1.64x, 16 rows 1.26/1.27/1.43x, 32 rows 1.38/1.35/1.24x.
TILE_ROWS = 16


class RowTiledLinear(nn.Module):
    """Wraps a linear-like module (x [rows, in] -> [rows, out]) to run it on fixed-size row tiles."""

    def __init__(self, inner: nn.Module, tile_rows: int = TILE_ROWS) -> None:
        super().__init__()
        self.inner = inner
        self.tile_rows = tile_rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:  # transformers' modules: [batch, tokens, in]
            out = self.forward(x.reshape(-1, x.shape[-1]))
            return out.view(*x.shape[:-1], out.shape[-1])
        num_rows = x.shape[0]
        num_tiles = -(-num_rows // self.tile_rows)
        num_padded = num_tiles * self.tile_rows
        if num_padded != num_rows:
            x = F.pad(x, (0, 0, 0, num_padded - num_rows))
        if num_tiles == 1:
            return self.inner(x)[:num_rows]
        return torch.cat([self.inner(tile) for tile in x.split(self.tile_rows)])[:num_rows]


class TiedHead(nn.Module):
    """The LM head of a model that ties it to its embedding, as a module that can be wrapped."""

    def __init__(self, embedding: nn.Embedding) -> None:
        super().__init__()
        self.embedding = embedding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.embedding.weight)


def tile_linears(model: nn.Module, tile_rows: int = TILE_ROWS) -> int:
    """Wrap every linear layer of `model` and its LM head in a RowTiledLinear; how many were wrapped.

    A linear layer is any module with `out_features` and no linear children: nn.Linear, and the
    packed and quantized layers that replace it (model_loader.PackedLinear, quantization).
    """
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if not isinstance(child, RowTiledLinear) and _is_linear(child)
    ]
    for parent, name, child in targets:
        setattr(parent, name, RowTiledLinear(child, tile_rows))
    if getattr(model, "lm_head", "absent") is None:  # tied and not packed: the embedding serves
        model.lm_head = RowTiledLinear(TiedHead(model.embed_tokens), tile_rows)
        return len(targets) + 1
    return len(targets)


def _is_linear(module: nn.Module) -> bool:
    """A linear layer that needs tiling: not one invariant by construction (loader.AmxLinear)."""
    return (hasattr(module, "out_features") and not any(True for _ in module.children())
            and not getattr(module, "row_invariant", False))
