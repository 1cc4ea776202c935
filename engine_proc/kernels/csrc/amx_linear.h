// bfloat16 linear layers through AMX micro-kernels over weights packed once (amx_linear.cpp): the
// operators rill_cpu::amx_linear_supported, amx_linear_pack, amx_linear, amx_linear_rope and
// amx_linear_silu_mul, whose schemas bindings.cpp registers.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>

namespace rill_amx_linear {

constexpr int64_t kPanel = 64;  // output columns per packed panel (the width oneDNN's pack writes)
constexpr int64_t kPrefetchRows = 4;  // rows up to which a decode step prefetches each panel whole (amx_linear.cpp)

inline int64_t num_panels(int64_t N) { return (N + kPanel - 1) / kPanel; }

// With Rope, a layer's first `cols` outputs are heads of 64 (a panel each) that leave rotated by
// RoPE, with cos and sin [M, 32] (rows `stride` apart): the bits of elementwise.cpp's rope_ on the
// layer's bfloat16 output (qkv_proj's q and k heads), without a second pass over them.
struct Rope {
    const uint16_t* cos;
    const uint16_t* sin;
    int64_t stride;
    int64_t cols;
};

}  // namespace rill_amx_linear

namespace rill_cpu {

// AMX-BF16, or a build for a CPU with AVX-512 BF16: where ATen's brgemm takes the packed pairs.
bool amx_linear_supported();
// The micro-kernel amx_linear's calls take now (inputs a multiple of 32): "amx_tiles" (amx_tiles.h),
// "avx512_bf16" (bf16_dot_panel.h) or "brgemm" (ATen's, oneDNN's micro-kernels). With `use` ("avx512_bf16" or
// "brgemm"), where the tiles are not, that one from now on: a benchmark's switch (RILL_BF16_DOT sets it at start).
std::string amx_linear_kernel(const std::optional<std::string>& use);
// A bfloat16 weight [out, in] packed into [ceil(out / 64), in * 64] panels.
at::Tensor amx_linear_pack(const at::Tensor& weight);
// x [rows, in] times a packed weight, plus bias: [rows, out_features].
at::Tensor amx_linear(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias,
                      int64_t out_features, bool fixed_tiles);
// amx_linear with its first rope_cols outputs (heads of 64) rotated by RoPE, cos and sin [rows, 1, 32].
at::Tensor amx_linear_rope(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias,
                           int64_t out_features, bool fixed_tiles, const at::Tensor& cos, const at::Tensor& sin,
                           int64_t rope_cols);
// silu(gate) * up of amx_linear's output (gate its first half): [rows, out_features / 2].
at::Tensor amx_linear_silu_mul(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias,
                               int64_t out_features, bool fixed_tiles);

}  // namespace rill_cpu
