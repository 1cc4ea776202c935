// 4-bit linears above the GEMV's rows, on CPUs with AVX-512 BF16 or AMX: each 64-column panel of the weight
// unpacked to bfloat16 pairs in the layout ATen's brgemm reads (amx_linear.cpp's), in a thread's own buffer,
// then multiplied into every activation row there. The weight is read from memory once a call, at 4.5 bits,
// and never written out as a whole float copy: the converted path (int4_gemv.cpp's int4_linear) wrote every
// slice to memory for oneDNN's GEMM, which spent about as long on the conversion as on the products
// (bench/results/int4_linears-amd-zen4.md: 1,021 against bfloat16's 604 ms for Qwen2.5-1.5B's linears at 64 rows).
//
// Unpacking: for 16 weight rows and one group of 32, each row's 32 values (q * scale + offset, in float32,
// then to bfloat16, the GEMV's and the dequantization's own rounding) are 16 pairs; the 16 x 16 pairs are
// transposed in registers and stored as 16 panel rows of 64 bytes (a panel row holds one pair of K for its 64
// columns). The products are brgemm's, 32 activation rows a call, accumulated in float32.
#include "int4_gemv.h"

#include <ATen/native/CPUBlas.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "aligned.h"
#include "amx_linear.h"
#include "bf16_simd.h"

namespace rill_int4_panels {

using rill_amx_linear::kPanel;
constexpr int64_t kTile = 32;  // activation rows per brgemm call (amx_linear.cpp's kTile)

#ifdef RILL_BF16_SIMD
// Group g's 32 weights of one row (16 packed bytes at p) as bfloat16, k = 0..31 in order: 16 pairs.
inline __m512i group_pairs(const uint8_t* p, __m512 scale, __m512 offset) {
    const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m512 lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(d, _mm512_set1_epi32(0x0f))), scale, offset);
    const __m512 hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(d, 4)), scale, offset);
    return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));  // lo in lanes 0..15, hi in 16..31
}

// r[i] (row i of a 16 x 16 matrix of 32-bit lanes) becomes column i.
inline void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {  // u[4i + c], lane L: column 4L + c of rows 4i..4i+3
        r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int c = 0; c < 4; ++c) {
        const __m512i v0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88), v1 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xdd);
        const __m512i w0 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88),
                      w1 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xdd);
        t[c] = _mm512_shuffle_i32x4(v0, w0, 0x88);       // column c
        t[4 + c] = _mm512_shuffle_i32x4(v1, w1, 0x88);   // column 4 + c
        t[8 + c] = _mm512_shuffle_i32x4(v0, w0, 0xdd);   // column 8 + c
        t[12 + c] = _mm512_shuffle_i32x4(v1, w1, 0xdd);  // column 12 + c
    }
    for (int i = 0; i < 16; ++i) r[i] = t[i];
}

// Weight rows [n0, n0 + 64) (rows past N zero) into panel [K / 2, 64 pairs]: pair (k, k + 1) of column j at
// (k / 2) * 128 + 2 j. K a multiple of 32; params: float scales and offsets, 16 rows x groups, reused.
void unpack_panel(uint16_t* panel, const rill_int4::Weight& w, int64_t N, int64_t n0, int64_t K, float* params) {
    const int64_t groups = K / 32, row_bytes = w.Kp / 2, row_groups = w.Kp / 32;
    for (int64_t j0 = 0; j0 < kPanel; j0 += 16) {
        const int64_t live = std::clamp<int64_t>(N - n0 - j0, 0, 16);
        float *scale = params, *offset = params + 16 * groups;
        for (int64_t j = 0; j < 16; ++j)
            for (int64_t g = 0; g < groups; ++g) {
                const int64_t i = (n0 + j0 + j) * row_groups + g;
                scale[j * groups + g] = j < live ? rill_int4::half_to_float(w.scales[i]) : 0.0f;
                offset[j * groups + g] = j < live ? rill_int4::half_to_float(w.offsets[i]) : 0.0f;
            }
        for (int64_t g = 0; g < groups; ++g) {
            __m512i r[16];
            for (int64_t j = 0; j < 16; ++j) {
                if (j >= live) {
                    r[j] = _mm512_setzero_si512();
                    continue;
                }
                const uint8_t* p = w.packed + (n0 + j0 + j) * row_bytes + 16 * g;
                if (g % 4 == 0) __builtin_prefetch(p + 256, 0, 0);
                r[j] = group_pairs(p, _mm512_set1_ps(scale[j * groups + g]), _mm512_set1_ps(offset[j * groups + g]));
            }
            transpose16(r);  // r[i]: pair 16 g + i of the 16 rows
            for (int64_t i = 0; i < 16; ++i)
                _mm512_store_si512(reinterpret_cast<__m512i*>(panel + (16 * g + i) * 2 * kPanel + 2 * j0), r[i]);
        }
    }
}

void linear(uint16_t* y, const uint16_t* x, int64_t M, int64_t N, int64_t K, const rill_int4::Weight& w) {
    using at::BFloat16;
    const int64_t P = rill_amx_linear::num_panels(N);
#pragma omp parallel
    {
        const auto panel = rill_mem::buffer<uint16_t>(K * kPanel);
        const auto params = rill_mem::buffer<float>(2 * 16 * (K / 32));
        const auto c = rill_mem::buffer<float>(kTile * kPanel);
#pragma omp for schedule(static)
        for (int64_t p = 0; p < P; ++p) {
            const int64_t n0 = p * kPanel, cols = std::min(kPanel, N - n0);
            unpack_panel(panel.get(), w, N, n0, K, params.get());
            for (int64_t m0 = 0; m0 < M; m0 += kTile) {
                const int64_t rows = std::min(kTile, M - m0);
                at::native::cpublas::brgemm(rows, kPanel, K, K, kPanel, kPanel, false,
                                            reinterpret_cast<const BFloat16*>(x + m0 * K),
                                            reinterpret_cast<const BFloat16*>(panel.get()), c.get());
                for (int64_t i = 0; i < rows; ++i) {
                    uint16_t* out = y + (m0 + i) * N + n0;
                    const float* acc = c.get() + i * kPanel;
                    for (int64_t j = 0; j < cols; j += 16)
                        rill_simd::store_bf16(out + j, _mm512_loadu_ps(acc + j), rill_simd::tail_mask(cols - j));
                }
            }
        }
        at::native::cpublas::brgemm_release();
    }
}
#endif

}  // namespace rill_int4_panels

namespace rill_cpu {

bool int4_panels_supported() {
#ifdef RILL_BF16_SIMD
    return true;
#else
    return false;
#endif
}

bool int4_panels_take(const at::Tensor& x, int64_t in_features) {
    return int4_panels_supported() && x.scalar_type() == at::kBFloat16 && in_features % 32 == 0 && x.dim() == 2;
}

at::Tensor int4_linear_panels(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                              const at::Tensor& offsets, int64_t in_features) {
    TORCH_CHECK(int4_panels_take(x, in_features), "int4_linear_panels: bfloat16 x [M, K], K a multiple of 32, "
                "on a build with AVX-512 BF16");
    const rill_int4::Weight w = rill_int4::weight_of(packed, scales, offsets, in_features);
    const at::Tensor xc = x.contiguous();
    const int64_t M = x.size(0), N = packed.size(0);
    at::Tensor y = x.new_empty({M, N});
#ifdef RILL_BF16_SIMD
    if (M > 0)
        rill_int4_panels::linear(reinterpret_cast<uint16_t*>(y.data_ptr()),
                                           reinterpret_cast<const uint16_t*>(xc.data_ptr()), M, N, in_features, w);
#endif
    return y;
}

}  // namespace rill_cpu
