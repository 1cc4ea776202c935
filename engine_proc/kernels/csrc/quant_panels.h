// Quantized linears above their GEMV's rows through brgemm over panels unpacked in cache, or AMX's tiles
// (quant_panels.cpp, quant_tiles.h): the
// int4 and int8 layers' prompt path and large decode steps, on a build with AVX-512 BF16. int4_linear and
// int8_linear (int4_gemv.cpp, int8_gemv.cpp) call them where quant_panels_take(x); the operator
// rill_cpu::quant_panels_kernel tells engine_proc/kernels which rows to send the GEMV.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>

namespace rill_cpu {

// Whether this build unpacks panels (AVX-512 BF16), and whether it takes this x: bfloat16 [M, K], K a multiple of 32.
bool quant_panels_supported();
// The products' kernel: "amx_tiles" (quant_tiles.h), "brgemm" (the panels) or "none" (a build without AVX-512
// BF16); `use` ("amx_tiles" or "brgemm") switches between the first two where the tiles can serve.
std::string quant_panels_kernel(const std::optional<std::string>& use);
bool quant_panels_take(const at::Tensor& x, int64_t in_features);
// x @ w.T for int4_gemv.h's 4-bit layout.
at::Tensor int4_linear_panels(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                              const at::Tensor& offsets, int64_t in_features);
// x @ (weight_int8 [N, Kp] * scale [N]).T, int8_gemv.h's layout.
at::Tensor int8_linear_panels(const at::Tensor& x, const at::Tensor& weight_int8, const at::Tensor& scale,
                              int64_t in_features);

}  // namespace rill_cpu
