"""Weight-only int8 quantization (`--quantization int8`): the linear layers and the LM head.

The scheme: each weight [N, K] is stored as int8 with one scale per output channel (symmetric,
scale = max |w[n, :]| / 127; a quarter of float32's bytes, half of bfloat16's). Activations stay
in floating point (W8A16). The head is quantized too: it is the largest single matrix of a small
model (SmolLM2-135M: 49,152 x 576, a fifth of the weights read per decode step). A tied head
gets a quantized copy; the embedding lookup keeps the float matrix, exact as before.

The kernel is torch's own `torch.ops.aten._weight_int8pack_mm(x, w_int8[N, K], scales[N])`.
What it does on x86 (torch 2.13: read in aten/src/ATen/native/cpu/int8mm_kernel.cpp, measured by
bench/kernels/quant_linears.py; figures from bench/results/quant_linears-cpu.md, a Sapphire Rapids, 2 threads):

- It is vectorized (AVX-512 or AVX2) for bfloat16 activations only; float32 and float16 take a
  scalar loop (the head at 1 row: 10.5 ms, against 4.5 ms for a float32 linear). So activations
  enter it as bfloat16 whatever `--dtype` is and leave it in the model's dtype: under `--dtype
  float32` an int8 linear at decode also rounds its input to bfloat16 (bench/kernels/quant_quality.py
  measures the whole). The scales are bfloat16 as the kernel wants them; each weight row is
  quantized against its bfloat16 scale, so the scale's rounding costs nothing beyond the int8's.
- It assumes K a multiple of 16 (8 on AVX2) and a row-contiguous, 32-byte-aligned input; other
  inputs read garbage or crash (a narrow K gave NaNs; an input offset by one element, a segfault).
  So weights are zero-padded to K % 16 == 0 and the input is made contiguous and aligned here.
- It computes 4 x 4 output tiles and converts each weight tile from int8 again for every 4 rows:
  a decode kernel. At 1 row it beats both float paths (the 49,152 x 576 head: 1.0 ms against
  4.5 ms float32 and 1.4 ms bfloat16; the MLP's gate/up: 0.06 ms against 0.17 and 0.06); its time
  grows with the rows (the head: 4.2 ms at 8 rows, 15 ms at 32, 113 ms at 256).

Rill's own kernel (csrc/int8_gemv.cpp, built for this CPU by engine_proc/kernels/extension.py) takes
decode rows first, up to `GEMV_MAX_ROWS` (kept here, passed to the C++ operator): each thread
streams a contiguous range of weight rows with software prefetch, converts 16 int8 values in two
instructions and multiplies them into every activation row, in float32 or bfloat16 alike. The whole bundled model at one row: 5.2-5.7 ms against
10.4 ms in torch's kernel, which reached about half the memory bandwidth on its small matrices;
at 8 rows 13.6 against 27 ms; at 16 rows 26 ms against 39 ms for the converted GEMM (the crossover
is about 24). Without a compiler, torch's kernel as below.
Hence the hybrid, no float copy kept: up to `KERNEL_MAX_ROWS` rows (decode steps) the int8 kernel;
above (prefill), the int8 weight converted to the model's dtype a slice at a time, oneDNN's GEMM,
and the scales applied to the output, which amortizes the conversion over the rows (the head at
256 rows: 26 ms, against 113 ms in the kernel and 10 ms for bfloat16 weights). The crossover is
at 13-16 rows against bfloat16's AMX GEMM and 22-55 rows against float32's. Where bfloat16 has
native matmul (AMX, AVX512-BF16) bfloat16 weights stay faster than int8 from about 4 rows up: int8
is for memory and for decode at low concurrency, and costs prefill time.

Per-group scales are not offered. The kernel takes one scale per output channel, so groups would put
every step on the slower converting path, and they buy little: per-channel int8 keeps perplexity
within 0.1% of the float model's and the top-1 next token the same at 95-96% of positions
(bench/results/quant_quality-cpu.md); simulated on the float32 weights (a one-off over 8 of its
windows), groups of 64 raised that top-1 agreement from 96.4% to 97.1%, of 32 to 97.9%, with no
better perplexity. Clipping each channel's range for the least squared error changed nothing.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rill.engine_proc.kernels import extension

# Rows up to which the int8 kernel beats the converted weight's GEMM, by activation dtype (measured
# by bench/kernels/quant_linears.py for every shape of the bundled model, 1 and 2 threads on a Sapphire
# Rapids: the crossover is at 12-17 rows against bfloat16's AMX GEMM, 22-55 against float32's).
KERNEL_MAX_ROWS = {torch.float32: 32, torch.bfloat16: 16}
_DEFAULT_KERNEL_MAX_ROWS = 16
# Rows up to which csrc/int8_gemv.cpp runs (it reads the weight once per 8 rows; the converted
# GEMM overtakes it at about 24 on a Sapphire Rapids, 2 threads). Passed to rill_cpu::int8_linear
# with DEQUANT_CHUNK_ELEMS: both figures live here only.
GEMV_MAX_ROWS = 24
# Where csrc/quant_panels.cpp runs (AVX-512 BF16, bfloat16 activations, K a multiple of 32), the rows up to
# which the GEMV beats it instead. Measured on a 2-core Zen 4, a layer's linears times the layers, and the head,
# GEMV against panels: the bundled model's 16.1 + 4.5 against 17.2 + 5.5 ms at 8 rows, 28.4 + 10.7 against
# 17.3 + 6.4 at 12; Qwen2.5-1.5B's 254 + 44 against 238 + 37 at 8, 950 + 183 against 524 + 65 at 32.
PANELS_GEMV_MAX_ROWS = 8
_GEMV_DTYPES = (torch.float32, torch.bfloat16)
# A large weight (the head) is converted in slices of about this many elements: a whole float
# copy of the head is a fresh allocation above malloc's mmap threshold, so every call paid its
# page faults (measured: 2-3x the conversion itself); slices stay in reused heap memory.
DEQUANT_CHUNK_ELEMS = 1 << 21
# The kernel's dtype: its only vectorized one on x86.
KERNEL_DTYPE = torch.bfloat16
_K_MULTIPLE = 16
_ALIGN_BYTES = 64


def quantize_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 [N, K], bfloat16 scales [N]) with weight ~= int8 * scale[:, None], |int8| <= 127."""
    w = weight.detach().to(torch.float32)
    max_abs = w.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny)
    scale_f32 = max_abs / 127.0
    scale = scale_f32.to(KERNEL_DTYPE)
    # Round the bf16 scale up where it rounded down, so that the largest weight stays in range.
    rounded_down = scale.to(torch.float32) < scale_f32
    scale = torch.where(rounded_down, torch.nextafter(scale, torch.full_like(scale, float("inf"))), scale)
    q = torch.round(w / scale.to(torch.float32).unsqueeze(1)).clamp_(-127, 127).to(torch.int8)
    return q, scale


class Int8Linear(nn.Module):
    """y = x @ (w_int8 * scale).T + bias, from a float weight [N, K] (and an optional bias).

    The path is chosen once, here: Rill's C++ operator rill_cpu::int8_linear (the GEMV, or the
    converted weight's GEMM for many rows) where it is built and takes the weight's dtype, which the
    activations share; else torch's int8 kernel and the converted GEMM (int8_matmul)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        q, scale = quantize_per_channel(weight)
        pad = -self.in_features % _K_MULTIPLE
        if pad:  # zero columns add nothing to the dot products
            q = F.pad(q, (0, pad))
        self.register_buffer("weight_int8", q.contiguous())
        self.register_buffer("scale", scale)
        self.bias = None if bias is None else bias.detach().clone()
        self.uses_kernels = weight.device.type == "cpu" and weight.dtype in _GEMV_DTYPES and extension.available()
        self.panels = self.uses_kernels and torch.ops.rill_cpu.quant_panels_supported()
        self.float_dtype = weight.dtype  # the model's: its activations'

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead_shape = x.shape[:-1]
        x2d = x.reshape(-1, self.in_features)
        if self.uses_kernels:  # one operator, eager or in a compiled decode graph: no Python inside the step
            y = torch.ops.rill_cpu.int8_linear(x2d, self.weight_int8, self.scale, self.in_features,
                                               self.gemv_max_rows(x.dtype), DEQUANT_CHUNK_ELEMS)
        elif torch.compiler.is_compiling():
            # In a compiled decode graph the row count is symbolic: one opaque op that chooses the
            # path by the real count at run time (engine_proc/model/decode_graphs.py).
            y = int8_linear(x2d, self.weight_int8, self.scale, self.in_features)
        else:
            y = int8_matmul(x2d, self.weight_int8, self.scale, self.in_features)
        return self._biased(y).view(*lead_shape, self.out_features)

    def gemv_max_rows(self, dtype: torch.dtype) -> int:
        """The rows up to which rill_cpu::int8_linear takes the GEMV for activations of `dtype`."""
        return PANELS_GEMV_MAX_ROWS if self.panels and dtype == torch.bfloat16 else GEMV_MAX_ROWS

    def gemv_forward(self, x: torch.Tensor) -> torch.Tensor | None:
        """Rill's GEMV kernel (rill_cpu::int8_gemv) on activations [M, K]; None where it is not built."""
        if not self.uses_kernels:
            return None
        x = x if x.stride(-1) == 1 else x.contiguous()
        return self._biased(torch.ops.rill_cpu.int8_gemv(x, self.weight_int8, self.scale, self.in_features))

    def kernel_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The int8 kernel on bfloat16 activations [M, K] (the decode path); output in x's dtype."""
        return self._biased(kernel_matmul(x, self.weight_int8, self.scale, self.in_features))

    def dequantized_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The prefill path: see dequantized_matmul."""
        return self._biased(dequantized_matmul(x, self.weight_int8, self.scale, self.in_features))

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float weight [N, K] the int8 one stands for."""
        return (self.weight_int8[:, : self.in_features].float() * self.scale.float().unsqueeze(1)).to(dtype)

    def _biased(self, y: torch.Tensor) -> torch.Tensor:
        return y if self.bias is None else y + self.bias


def int8_matmul(x: torch.Tensor, weight_int8: torch.Tensor, scale: torch.Tensor, in_features: int) -> torch.Tensor:
    """x [M, in_features] @ (weight_int8 [N, K] * scale [N]).T in x's dtype, in torch (the C++
    operator's twin): torch's int8 kernel up to KERNEL_MAX_ROWS rows (decode), the converted
    weight's GEMM above (prefill)."""
    if x.shape[0] <= KERNEL_MAX_ROWS.get(x.dtype, _DEFAULT_KERNEL_MAX_ROWS):
        return kernel_matmul(x, weight_int8, scale, in_features)
    return dequantized_matmul(x, weight_int8, scale, in_features)


def kernel_matmul(x: torch.Tensor, weight_int8: torch.Tensor, scale: torch.Tensor, in_features: int) -> torch.Tensor:
    a = x.to(KERNEL_DTYPE)
    pad = weight_int8.shape[1] - in_features
    if pad:
        a = F.pad(a, (0, pad))
    if not a.is_contiguous() or a.data_ptr() % _ALIGN_BYTES:
        a = a.clone(memory_format=torch.contiguous_format)  # fresh storage is 64-byte aligned
    return torch.ops.aten._weight_int8pack_mm(a, weight_int8, scale).to(x.dtype)


def dequantized_matmul(x: torch.Tensor, weight_int8: torch.Tensor, scale: torch.Tensor,
                       in_features: int) -> torch.Tensor:
    """oneDNN's GEMM on the int8 weight converted to x's dtype, a slice of rows at a time, then the
    scales on the output columns (y[:, n] = s[n] * (x @ q[n])). The conversion is exact (|q| <= 127
    fits bfloat16's 8-bit significand); scaling the output instead of the weight saves a pass over
    the weight (measured: up to 1.8x faster)."""
    q = weight_int8[:, :in_features]
    out_features = q.shape[0]
    rows_per_chunk = max(1, DEQUANT_CHUNK_ELEMS // in_features)
    if out_features <= rows_per_chunk:
        y = F.linear(x, q.to(x.dtype))
    else:
        y = torch.empty(x.shape[0], out_features, dtype=x.dtype, device=x.device)
        for start in range(0, out_features, rows_per_chunk):
            end = min(start + rows_per_chunk, out_features)
            y[:, start:end] = F.linear(x, q[start:end].to(x.dtype))
    return y.mul_(scale.to(x.dtype))


@torch.library.custom_op("rill::int8_linear", mutates_args=())
def int8_linear(x: torch.Tensor, weight_int8: torch.Tensor, scale: torch.Tensor, in_features: int) -> torch.Tensor:
    """int8_matmul as one op for torch.compile."""
    return int8_matmul(x, weight_int8, scale, in_features)


@int8_linear.register_fake
def _(x: torch.Tensor, weight_int8: torch.Tensor, scale: torch.Tensor, in_features: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight_int8.shape[0])
