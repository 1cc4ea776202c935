// 4-bit and int8 linears above their GEMV's rows, on CPUs with AVX-512 BF16 (or AMX): each 64-column panel of
// the quantized weight unpacked to bfloat16 pairs in the layout ATen's brgemm reads (amx_linear.cpp's), in a
// thread's own buffer, then multiplied into every activation row there. The weight is read from memory once a
// call, in its own bytes, and never written out as a whole float copy: the converted path (int4_gemv.cpp's and
// int8_gemv.cpp's) wrote every slice to memory for oneDNN's GEMM, which spent about as long on the conversion as
// on the products (bench/results/int4_linears-amd-zen4.md: 1,021 against bfloat16's 604 ms for Qwen2.5-1.5B's
// linears at 64 rows).
//
// Unpacking: for 16 weight rows and one group of 32 along K, each row's 32 values are 16 bfloat16 pairs (int4:
// q * scale + offset in float32, then rounded, the GEMV's and the dequantization's own values; int8: q itself,
// exact, its row's scale applied to the output); the 16 x 16 pairs are transposed in registers and stored as 16
// panel rows of 64 bytes (a panel row holds one pair of K for its 64 columns). The products are brgemm's, 32
// activation rows a call, accumulated in float32. Where AMX's tiles serve, quant_tiles.h runs instead (the same
// bits, in about half the time: it says why).
#include <ATen/native/CPUBlas.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "aligned.h"
#include "amx_linear.h"
#include "bf16_simd.h"
#include "float_bits.h"
#include "int4_gemv.h"
#include "quant_panels.h"
#include "quant_rows.h"
#include "quant_tiles.h"

namespace rill_quant_panels {

using rill_amx_linear::kPanel;
constexpr int64_t kTile = 32;  // activation rows per brgemm call (amx_linear.cpp's kTile)

// Whether quant_tiles.h's kernel serves (AMX's tiles; quant_panels_kernel(use) switches it, for benchmarks).
std::atomic<bool>& tiles_on() {
    static std::atomic<bool> on{true};
    return on;
}

bool tiles() {
#ifdef RILL_QUANT_TILES
    return tiles_on().load(std::memory_order_relaxed) && rill_amx_tiles::available();
#else
    return false;
#endif
}

#ifdef RILL_BF16_SIMD
// Weight rows [n0, n0 + 64) (rows past N zero) into panel [K / 2, 64 pairs]: pair (k, k + 1) of column j at
// (k / 2) * 128 + 2 j. K a multiple of 32.
template <typename Rows>
void unpack_panel(uint16_t* panel, Rows& rows, int64_t N, int64_t n0, int64_t K) {
    for (int64_t j0 = 0; j0 < kPanel; j0 += 16) {
        const int64_t live = std::clamp<int64_t>(N - n0 - j0, 0, 16);
        rows.begin(n0 + j0, live);
        for (int64_t g = 0; g < K / 32; ++g) {
            __m512i r[16];
            for (int64_t j = 0; j < 16; ++j) {
                if (j < live) rows.prefetch_ahead(n0 + j0 + j, g);
                r[j] = j < live ? rows.pairs_of(n0 + j0, j, g) : _mm512_setzero_si512();
            }
            rill_quant_rows::transpose16(r);  // r[i]: pair 16 g + i of the 16 rows
            for (int64_t i = 0; i < 16; ++i)
                _mm512_store_si512(reinterpret_cast<__m512i*>(panel + (16 * g + i) * 2 * kPanel + 2 * j0), r[i]);
        }
    }
}

// y [M, N] bfloat16 = x [M, K] bfloat16 times the weight whose panels `make_rows()` unpacks; each output column
// times col_scale[n] (bfloat16 bits) where given.
template <typename MakeRows>
void linear(uint16_t* y, const uint16_t* x, int64_t M, int64_t N, int64_t K, MakeRows&& make_rows,
            const uint16_t* col_scale) {
    using at::BFloat16;
#ifdef RILL_QUANT_TILES
    if (tiles()) return rill_quant_tiles::linear(y, x, M, N, K, make_rows, col_scale);
#endif
    const int64_t P = rill_amx_linear::num_panels(N);
#pragma omp parallel
    {
        const auto panel = rill_mem::buffer<uint16_t>(K * kPanel);
        const auto params = rill_mem::buffer<float>(2 * 16 * (K / 32));
        const auto c = rill_mem::buffer<float>(kTile * kPanel);
        auto rows = make_rows(params.get());
        alignas(64) float scale[kPanel];
#pragma omp for schedule(static)
        for (int64_t p = 0; p < P; ++p) {
            const int64_t n0 = p * kPanel, cols = std::min(kPanel, N - n0);
            unpack_panel(panel.get(), rows, N, n0, K);
            for (int64_t j = 0; j < kPanel; ++j)
                scale[j] = col_scale && j < cols ? rill_float::to_float(col_scale[n0 + j]) : 1.0f;
            for (int64_t m0 = 0; m0 < M; m0 += kTile) {
                const int64_t tile_rows = std::min(kTile, M - m0);
                at::native::cpublas::brgemm(tile_rows, kPanel, K, K, kPanel, kPanel, false,
                                            reinterpret_cast<const BFloat16*>(x + m0 * K),
                                            reinterpret_cast<const BFloat16*>(panel.get()), c.get());
                for (int64_t i = 0; i < tile_rows; ++i) {
                    uint16_t* out = y + (m0 + i) * N + n0;
                    const float* acc = c.get() + i * kPanel;
                    for (int64_t j = 0; j < cols; j += 16)
                        rill_simd::store_bf16(out + j, _mm512_mul_ps(_mm512_loadu_ps(acc + j), _mm512_load_ps(scale + j)),
                                              rill_simd::tail_mask(cols - j));
                }
            }
        }
        at::native::cpublas::brgemm_release();
    }
}
#endif

}  // namespace rill_quant_panels

namespace rill_cpu {

bool quant_panels_supported() {
#ifdef RILL_BF16_SIMD
    return true;
#else
    return false;
#endif
}

std::string quant_panels_kernel(const std::optional<std::string>& use) {
    if (use) {
        TORCH_CHECK(*use == "amx_tiles" || *use == "brgemm", "quant_panels_kernel: use amx_tiles or brgemm");
        rill_quant_panels::tiles_on().store(*use == "amx_tiles");
    }
    if (!quant_panels_supported()) return "none";
    return rill_quant_panels::tiles() ? "amx_tiles" : "brgemm";
}

bool quant_panels_take(const at::Tensor& x, int64_t in_features) {
    return quant_panels_supported() && x.scalar_type() == at::kBFloat16 && in_features % 32 == 0 && x.dim() == 2;
}

at::Tensor int4_linear_panels(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                              const at::Tensor& offsets, int64_t in_features) {
    TORCH_CHECK(quant_panels_take(x, in_features), "int4_linear_panels: bfloat16 x [M, K], K a multiple of 32, "
                "on a build with AVX-512 BF16");
    const rill_int4::Weight w = rill_int4::weight_of(packed, scales, offsets, in_features);
    const at::Tensor xc = x.contiguous();
    const int64_t M = x.size(0), N = packed.size(0);
    at::Tensor y = x.new_empty({M, N});
#ifdef RILL_BF16_SIMD
    if (M > 0)
        rill_quant_panels::linear(
            reinterpret_cast<uint16_t*>(y.data_ptr()), reinterpret_cast<const uint16_t*>(xc.data_ptr()), M, N,
            in_features, [&](float* params) { return rill_quant_rows::Int4Rows{w, in_features / 32, params}; },
            nullptr);
#endif
    return y;
}

at::Tensor int8_linear_panels(const at::Tensor& x, const at::Tensor& weight_int8, const at::Tensor& scale,
                              int64_t in_features) {
    TORCH_CHECK(quant_panels_take(x, in_features), "int8_linear_panels: bfloat16 x [M, K], K a multiple of 32, "
                "on a build with AVX-512 BF16");
    TORCH_CHECK(weight_int8.scalar_type() == at::kChar && weight_int8.dim() == 2 && weight_int8.is_contiguous() &&
                    weight_int8.size(1) >= in_features && scale.scalar_type() == at::kBFloat16 &&
                    scale.is_contiguous() && scale.numel() == weight_int8.size(0),
                "int8_linear_panels: an int8 weight [N, Kp] (Kp >= in_features) and bfloat16 scales [N], contiguous");
    const at::Tensor xc = x.contiguous();
    const int64_t M = x.size(0), N = weight_int8.size(0), Kp = weight_int8.size(1);
    at::Tensor y = x.new_empty({M, N});
#ifdef RILL_BF16_SIMD
    const int8_t* w = weight_int8.data_ptr<int8_t>();
    if (M > 0)
        rill_quant_panels::linear(reinterpret_cast<uint16_t*>(y.data_ptr()),
                                  reinterpret_cast<const uint16_t*>(xc.data_ptr()), M, N, in_features,
                                  [&](float*) { return rill_quant_rows::Int8Rows{w, Kp}; },
                                  reinterpret_cast<const uint16_t*>(scale.data_ptr()));
#endif
    return y;
}

}  // namespace rill_cpu
