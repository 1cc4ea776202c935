// Weight-only 4-bit linears (int4_gemv.cpp): the operators rill_cpu::int4_gemv, rill_cpu::int4_dequant and
// rill_cpu::int4_linear, whose schemas bindings.cpp registers.
//
// The layout (engine_proc/kernels/int4_linear.py makes it, from a float weight or a GGUF Q4_0/Q4_1
// tensor): a weight [N, K] in groups of 32 along K, K padded with zeros to Kp, a multiple of 64 (whole pairs of
// groups, which the AVX512-VNNI kernel takes at once).
//   packed  uint8 [N, Kp / 2]: group g of row n is bytes 16g..16g+15; byte j holds element 32g + j in its
//           low four bits and element 32g + 16 + j in its high four (GGUF's Q4_0 and Q4_1 order);
//   scales  float16 [N, Kp / 32] and offsets float16 [N, Kp / 32]: w = q * scale + offset, q in 0..15
//           (Q4_0's symmetric blocks have offset = -8 * scale).
#pragma once
#include <ATen/core/Tensor.h>

namespace rill_cpu {

// x [M, K] (float32 or bfloat16, rows contiguous) @ w.T, every weight read once per 8 rows.
at::Tensor int4_gemv(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                     const at::Tensor& offsets, int64_t in_features);
// Rows [start, start + count) of w as `like`'s dtype: [count, in_features].
at::Tensor int4_dequant(const at::Tensor& packed, const at::Tensor& scales, const at::Tensor& offsets,
                        int64_t in_features, int64_t start, int64_t count, const at::Tensor& like);
// The GEMV up to gemv_max_rows rows, else w converted to x's dtype, chunk_elems at a time, and oneDNN's
// GEMM (engine_proc/kernels/int4_linear.py passes both figures).
at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                       const at::Tensor& offsets, int64_t in_features, int64_t gemv_max_rows, int64_t chunk_elems);

}  // namespace rill_cpu
