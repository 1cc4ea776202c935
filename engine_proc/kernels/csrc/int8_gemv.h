// Weight-only int8 linears (int8_gemv.cpp): the operators rill_cpu::int8_gemv and
// rill_cpu::int8_linear, whose schemas bindings.cpp registers.
#pragma once
#include <ATen/core/Tensor.h>

namespace rill_cpu {

// x [M, K] (float32 or bfloat16, rows contiguous) @ (weight_int8 [N, Kp] * scale [N]).T.
at::Tensor int8_gemv(const at::Tensor& x, const at::Tensor& weight_int8, const at::Tensor& scale, int64_t in_features);
// The GEMV up to gemv_max_rows rows; above, int8_linear_panels (quant_panels.h) where it takes x, else the int8
// weight converted to x's dtype, chunk_elems at a time, and oneDNN's GEMM: both figures are
// engine_proc/kernels/int8_linear.py's, passed in so that they live in one place.
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& weight_int8, const at::Tensor& scale, int64_t in_features,
                       int64_t gemv_max_rows, int64_t chunk_elems);

}  // namespace rill_cpu
