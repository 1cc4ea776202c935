"""The linear-layer kinds on the CPU: oneDNN's prepacked weights and Rill's AMX kernel, chosen once per layer."""
from __future__ import annotations

import logging

import torch
from torch import nn

from rill.engine_proc.kernels import extension
from rill.engine_proc.kernels.quantization import swappable

log = logging.getLogger("rill.model")

# oneDNN's blocked weight layout is chosen for an expected number of rows; 8 serves decode
# batches of 1 to 32 well (measured: 15-25% faster decode steps than F.linear).
_PACKING_NUM_ROWS_HINT = 8


class PackedLinear(nn.Module):
    """A linear layer whose weight oneDNN has reordered once into its blocked CPU layout.

    At decode batch sizes F.linear reads fp32 weights at about half the memory bandwidth
    the machine has; the prepacked oneDNN path gets most of the rest.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features = weight.shape[0]
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(
            weight.detach(), _PACKING_NUM_ROWS_HINT
        )
        self.bias = None if bias is None else bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() > 3:  # as rows: Inductor's freezing pass takes a reshape to more than 2-D before this op for
            # one of its own (DeepSeek V3's kv_b_proj after its view), and fails
            rows = torch.ops.mkldnn._linear_pointwise(x.flatten(0, -2), self.packed_weight, self.bias, "none", [], "")
            return rows.unflatten(0, x.shape[:-1])
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")


class AmxLinear(nn.Module):
    """A bfloat16 linear layer on a CPU with AMX: Rill's kernel (csrc/amx_linear.cpp) over a
    weight packed once into 64-column panels. With `fixed_tiles` (--batch-invariant) every kernel
    call has the same shape, so it is batch invariant by construction and tile_linears leaves it
    untiled (`row_invariant`)."""

    fuses_rope = True  # rope(): qkv_proj's q and k heads (of 64) rotated in the epilogue

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, fixed_tiles: bool = False) -> None:
        super().__init__()
        self.out_features = weight.shape[0]
        self.fixed_tiles = fixed_tiles
        self.packed_weight = torch.ops.rill_cpu.amx_linear_pack(weight.detach())
        # float32 once here, as the kernel adds it, not converted on every call
        self.bias = None if bias is None else bias.detach().float().contiguous()
        # silu_mul(): gate and up each whole 64-column panels
        self.fuses_silu_mul = self.out_features % 128 == 0

    @property
    def row_invariant(self) -> bool:
        return self.fixed_tiles

    @staticmethod
    def applies(weight: torch.Tensor) -> bool:
        return (weight.dtype == torch.bfloat16 and weight.device.type == "cpu" and weight.shape[1] % 2 == 0
                and extension.available() and torch.ops.rill_cpu.amx_linear_supported())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._call(torch.ops.rill_cpu.amx_linear, x, self.out_features)

    def silu_mul(self, x: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of this gate_up projection's output, in one pass (the bits of
        fused_ops.silu_mul(self(x)), without writing the projection out)."""
        return self._call(torch.ops.rill_cpu.amx_linear_silu_mul, x, self.out_features // 2)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int) -> torch.Tensor:
        """The output with its first num_heads heads of 64 rotated by RoPE (cos, sin [rows, 1, 32]) in
        the kernel's epilogue: the bits of fused_ops.rope_heads on self(x), in one pass."""
        return torch.ops.rill_cpu.amx_linear_rope(x, self.packed_weight, self.bias, self.out_features,
                                                  self.fixed_tiles, cos, sin, num_heads * 64)

    def _call(self, op, x: torch.Tensor, width: int) -> torch.Tensor:
        rows = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
        out = op(rows, self.packed_weight, self.bias, self.out_features, self.fixed_tiles)
        return out if x.dim() == 2 else out.view(*x.shape[:-1], width)


class PanelEmbedding(nn.Module):
    """A tied embedding's lookups from its AmxLinear head's panels: the model keeps one copy of the matrix, not
    the embedding and a packed head (Qwen2.5-1.5B's is 0.47 GB of its 3.3). Weight row n is column n % 64 of
    panel n // 64, its (k, k + 1) pairs 128 elements apart (amx_linear.cpp's pack). The packed weight is a
    plain attribute, not a child module: tile_linears and the LoRA swaps see the head once, as model.lm_head."""

    def __init__(self, head: AmxLinear, embedding: nn.Embedding) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = embedding.num_embeddings, embedding.embedding_dim
        self.packed_weight = head.packed_weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        panels = self.packed_weight.view(self.packed_weight.shape[0], -1, 64, 2)
        return panels[ids // 64, :, ids % 64].reshape(*ids.shape, self.embedding_dim)


# Where AmxLinear is the default (bench/results/linear_kernels-cpu.md, cold weights): every
# projection, not the head. At decode sizes it took 0.76-0.99x oneDNN's time (oneDNN's per-call
# overhead weighs on a small layer); at prompt sizes 0.70x on o_proj and down_proj, whose 576
# outputs oneDNN's inner product blocks poorly, 1.03x on qkv_proj, 1.17x on gate_up_proj with its
# SiLU (in the epilogue here, a separate pass after oneDNN), which came out even in a whole
# prefill and 1.3 ms faster in a compiled decode step at batch 1; the head is even within noise.
# The same holds for the transformers route's separate q, k, v, gate and up projections: a compiled
# 16-row decode step of OLMo 2's bench shape (bench.families) took 4.57 ms with them on oneDNN,
# 3.88 ms on AmxLinear (Zen 4, AVX-512 BF16).
HEAD = "lm_head"


def packed_linear(weight: torch.Tensor, bias: torch.Tensor | None, name: str, batch_invariant: bool,
                  tied: bool = False) -> nn.Module:
    """The packed form of linear layer `name` on this CPU: AmxLinear where it applies and is the
    faster (every projection, and under --batch-invariant, which it serves without row tiles, the
    head too), or saves memory (a tied head, whose panels serve the embedding: PanelEmbedding), else oneDNN's."""
    if (batch_invariant or tied or name != HEAD) and AmxLinear.applies(weight):
        return AmxLinear(weight, bias, fixed_tiles=batch_invariant)
    return PackedLinear(weight, bias)


def pack_linears_for_cpu(model: nn.Module, batch_invariant: bool = False) -> None:
    """Swap every nn.Linear (and the tied head) for a packed layer (packed_linear) where the CPU
    supports one."""
    if not torch.backends.mkldnn.is_available():
        return
    try:
        replacements = [
            (parent, child_name, packed_linear(child.weight, child.bias, child_name, batch_invariant))
            for parent in model.modules()
            for child_name, child in parent.named_children()
            if swappable(parent, child)
        ]
        # A packed copy of the tied embedding, for a head that is about a fifth of a small model's weight
        # reads per step; on AmxLinear it serves the embedding's lookups too (PanelEmbedding).
        tied_head = None
        if model.lm_head is None:
            tied_head = packed_linear(model.embed_tokens.weight, None, HEAD, batch_invariant, tied=True)
    except (RuntimeError, AttributeError) as e:  # bf16 on a CPU without AVX512; an older torch
        dtype = model.embed_tokens.weight.dtype
        log.info("keeping plain F.linear: oneDNN cannot pack %s weights here (%s)", dtype, e)
        return
    for parent, child_name, packed in replacements:
        setattr(parent, child_name, packed)
    if tied_head is not None:
        model.lm_head = tied_head
        if isinstance(tied_head, AmxLinear):
            model.embed_tokens = PanelEmbedding(tied_head, model.embed_tokens)
