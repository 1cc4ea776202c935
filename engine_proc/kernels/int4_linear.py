"""Weight-only 4-bit quantization (`--quantization int4`).

The scheme: each weight [N, K] in groups of 32 along K, each group with a float16 scale and offset,
w = q * scale + offset with q in 0..15 (asymmetric: offset = the group's minimum, scale = its range / 15):
5 bits a weight, 0.63 of int8's bytes. A decode step on a CPU reads every weight once, so its time follows.
`--int4-group-size 128` gives a scale and offset to 128 weights (4.25 bits); `--int4-symmetric` keeps no offsets
(offset = -8 * scale; 4.5 bits in groups of 32, 4.125 in groups of 128). GGUF's Q4_1 blocks are the asymmetric
groups of 32 exactly and Q4_0's the symmetric ones: both repack without loss. Q4_K's blocks keep their 6-bit codes
(two-level: a scale and offset code per 32, float16 factors per 256; 4.625 bits). The layout is csrc/int4_gemv.h's;
the kernels are csrc/int4_gemv.cpp:
  - up to GEMV_MAX_ROWS rows (decode steps) the GEMV, which streams the packed weight once per 8 rows;
  - above, on a CPU with AVX-512 BF16 (or AMX) and bfloat16 activations, csrc/quant_panels.cpp: each 64-column
    panel unpacked to bfloat16 in a thread's cache and multiplied by brgemm, from PANELS_GEMV_MAX_ROWS rows up; with
    AMX, csrc/quant_tiles.h instead (each 32 rows unpacked straight into the tiles, no transpose), from
    TILES_GEMV_MAX_ROWS rows up;
  - else (prompts), the weight converted to the activations' dtype a slice at a time, and oneDNN's GEMM.
Without the built kernels, the torch twin (dequantize, F.linear): the same within rounding, slow. The LM
head stays int8 (kernels/quantization.py says why).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rill.engine_proc.kernels import extension

GROUP = 32
GROUP_SIZES = (32, 128)  # weights a scale covers: --int4-group-size
GEMV_MAX_ROWS = 24  # rows up to which the GEMV beats the converted weight's GEMM (bench/kernels/int4_linears.py)
# Rows up to which it beats the panels (csrc/quant_panels.cpp), where they run: measured on a 2-core Zen 4 over every
# linear of a layer, GEMV against panels: the bundled model's shapes 17.1 against 15.4 ms at 8 rows, 24.8
# against 17.4 at 12, 33.9 against 19.4 at 16; Qwen2.5-1.5B's 143 against 211 at 8, 191 against 210 at 12,
# 245 against 257 at 16, 354 against 304 at 24 (unpacking a panel costs about 0.1 ns a weight).
PANELS_GEMV_MAX_ROWS = 12
# The same against the AMX tiles (csrc/quant_tiles.h), on a 2-core Xeon with AMX, since the GEMV sums eight groups a
# conversion and the tiles look their values up in a table (2026-12-06): over Qwen2.5-1.5B's linears (28 layers,
# the head apart), GEMV against tiles 52 against 80 ms at 8 rows, 75 against 80 at 12, 79 against 80 at 13, 91
# against 80 at 15. Short rows cost the GEMV more a weight (each output's sums are reduced at its end): the bundled
# model's K = 576 layers, 5.2 against 5.3 ms at 8 rows, 6.8 against 5.5 at 10.
TILES_GEMV_MAX_ROWS = 13
TILES_GEMV_MAX_ROWS_SHORT = 8  # for in_features below SHORT_ROW
SHORT_ROW = 1024
DEQUANT_CHUNK_ELEMS = 1 << 21  # as int8_linear.py's: slices of the head stay in reused heap memory
_DTYPES = (torch.float32, torch.bfloat16)


def quantize_int4(weight: torch.Tensor, group_size: int = GROUP, symmetric: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(packed uint8 [N, Kp / 2], scales float16 [N, P], offsets float16 [N, P] or [N, 0]) of a float weight [N, K],
    K zero-padded to Kp, a multiple of 64; P = Kp / group_size rounded up (group_size 32 or 128). Asymmetric: the
    offset is the group's minimum and the scale its range / 15. Symmetric (offsets [N, 0], offset = -8 * scale, as
    GGUF's Q4_0): the scale is the group's value of largest magnitude / -8, so that it is q = 0 exactly. Each q is
    against the rounded scale and offset."""
    if group_size not in GROUP_SIZES:
        raise ValueError(f"int4 group size {group_size}: expected one of {GROUP_SIZES}")
    w = weight.detach().to(torch.float32)
    n, k = w.shape
    kp = k + -k % (2 * GROUP)  # whole pairs of groups of 32: the VNNI kernel takes two at once
    w = F.pad(w, (0, -k % max(group_size, 2 * GROUP))).view(n, -1, group_size)
    if symmetric:
        extreme = w.gather(-1, w.abs().argmax(-1, keepdim=True)).squeeze(-1)
        scales = (extreme / -8).to(torch.float16)
        offsets = -8 * scales.float()
    else:
        low, high = w.amin(-1), w.amax(-1)
        offsets = low.to(torch.float16).float()
        scales = ((high - offsets) / 15).to(torch.float16)
        # A scale that rounded down would put the group's largest weight past 15: one step up.
        short = offsets + 15 * scales.float() < high
        scales = torch.where(short, torch.nextafter(scales, torch.full_like(scales, float("inf"))), scales)
    step = torch.where(scales == 0, 1.0, scales.float()).unsqueeze(-1)
    q = torch.round((w - offsets.unsqueeze(-1)) / step).clamp_(0, 15).to(torch.uint8)
    q = q.view(n, -1)[:, :kp].reshape(n, -1, GROUP)
    return pack_nibbles(q), scales, (scales[:, :0] if symmetric else offsets.to(torch.float16))


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """q [N, groups, 32] in 0..15 as [N, groups * 16] bytes: element j low, element 16 + j high."""
    return (q[..., :16] | (q[..., 16:] << 4)).reshape(q.shape[0], -1).contiguous()


def dequantize_int4(packed: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor, in_features: int,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The float weight [N, in_features] of the packed one (the kernels' twin)."""
    n = packed.shape[0]
    b = packed.view(n, -1, 16)
    q = torch.cat((b & 15, b >> 4), dim=-1).float()
    scale, offset = group_params(packed, scales, offsets)
    return (q * scale.unsqueeze(-1) + offset.unsqueeze(-1)).reshape(n, -1)[:, :in_features].to(dtype)


def group_params(packed: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each group of 32's scale and offset, float32 [N, Kp / 32]: groups of 128's repeated, symmetric weights' offsets
    -8 * scale, two-level ones' (GGUF Q4_K's: uint8 codes, then float16 d and dmin per 8 groups) d * code and
    -dmin * min code."""
    n, groups = packed.shape[0], packed.shape[1] // 16
    if scales.dtype == torch.uint8:
        supers = scales[:, groups:].contiguous().view(torch.float16).float().view(n, -1, 2).repeat_interleave(8, dim=1)
        return scales[:, :groups].float() * supers[..., 0], -offsets.float() * supers[..., 1]
    group = group_size_of(packed, scales) // GROUP
    scale = scales.float().repeat_interleave(group, dim=1)[:, :groups]
    offset = -8 * scale if offsets.shape[1] == 0 else offsets.float().repeat_interleave(group, dim=1)[:, :groups]
    return scale, offset


def group_size_of(packed: torch.Tensor, scales: torch.Tensor) -> int:
    """The weights a scale covers, from the shapes: [N, Kp / 32] scales (or two-level codes) for groups of 32, fewer
    for 128."""
    return GROUP if scales.dtype == torch.uint8 or scales.shape[1] * GROUP == packed.shape[1] * 2 else 4 * GROUP


class Int4Linear(nn.Module):
    """y = x @ w.T + bias for a 4-bit weight, quantized here from a float weight [N, K]."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 packed: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None, group_size: int = GROUP,
                 symmetric: bool = False) -> None:
        """`packed`: the weight's (nibbles, scales, offsets) as they are (a GGUF's 4-bit blocks: model/gguf_int4.py);
        else quantized here in groups of `group_size`, `symmetric` or not (quantize_int4)."""
        super().__init__()
        self.out_features, self.in_features = weight.shape
        nibbles, scales, offsets = packed if packed is not None else quantize_int4(weight, group_size, symmetric)
        self.register_buffer("nibbles", nibbles.contiguous())
        self.register_buffer("scales", scales.contiguous())
        self.register_buffer("offsets", offsets.contiguous())
        self.bias = None if bias is None else bias.detach().clone()
        self.uses_kernels = weight.device.type == "cpu" and extension.available()
        kernel = torch.ops.rill_cpu.quant_panels_kernel() if self.uses_kernels else "none"
        # The GEMV's rows for bfloat16 activations (the panels take them above); other dtypes: GEMV_MAX_ROWS.
        tiles_rows = TILES_GEMV_MAX_ROWS if self.in_features >= SHORT_ROW else TILES_GEMV_MAX_ROWS_SHORT
        self.bf16_gemv_rows = {"amx_tiles": tiles_rows, "brgemm": PANELS_GEMV_MAX_ROWS}.get(kernel, GEMV_MAX_ROWS)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"group_size={group_size_of(self.nibbles, self.scales)}, symmetric={self.offsets.shape[1] == 0}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead_shape = x.shape[:-1]
        x2d = x.reshape(-1, self.in_features)
        if self.uses_kernels and x.dtype in _DTYPES:  # one operator, eager or in a compiled decode graph
            y = torch.ops.rill_cpu.int4_linear(x2d, self.nibbles, self.scales, self.offsets, self.in_features,
                                              self.bf16_gemv_rows if x.dtype == torch.bfloat16 else GEMV_MAX_ROWS,
                                              DEQUANT_CHUNK_ELEMS)
        else:
            y = F.linear(x2d, self.dequantized_weight(x.dtype))
        if self.bias is not None:
            y = y + self.bias
        return y.view(*lead_shape, self.out_features)

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float weight [N, K] the packed one stands for."""
        return dequantize_int4(self.nibbles, self.scales, self.offsets, self.in_features, dtype)
