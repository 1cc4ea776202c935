// Weight-only 4-bit matrix-vector products for decode steps, and the conversion for prompt steps:
// y[m, n] = sum_k x[m, k] * (q[n, k] * scale[n, k / 32] + offset[n, k / 32]), the layout of int4_gemv.h (there, groups
// of 128 and symmetric weights too).
//
// A decode step reads every weight once, so its speed is the memory bandwidth: at 5 bits a weight (nibbles, a
// float16 scale and offset per 32) a step reads 0.63 of int8's bytes (symmetric: 4.5 bits, 0.56). As int8_gemv.cpp
// does, each thread streams a contiguous range of weight rows, a few at a time, each block of rows prefetched first;
// per group of 32 it splits 16 bytes into their low and high nibbles, converts each half to 16 floats, applies
// the group's scale and offset in one FMA, and multiplies them into every activation row. Prompt steps
// convert the weight to the activations' dtype a slice at a time for oneDNN's GEMM.
//
// GCC vector extensions and a few intrinsics: AVX-512, AVX2 and SSE2 builds come from the same source. Decode
// steps run integer dot products where the CPU has them: AVX512-VNNI in int4_gemv_vnni.h, AVX2's vpmaddubsw in
// int4_gemv_avx2.h; the float path (rows()) is the SSE2 build's.
#include "int4_gemv.h"
#include "quant_panels.h"

#include <ATen/ops/linear_ops.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "bf16_simd.h"
#include "float_bits.h"
#include "simd16.h"
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "int4_gemv_avx2.h"
#endif
#include "int4_gemv_vnni.h"

namespace rill_int4 {

using rill_float::store;
using rill_float::to_float;
using rill_float::v16f;
using rill_simd::fma16;
using rill_simd::hsum;
using rill_simd::splat;

// The 32 weights of one group as floats: elements 0..15 (low nibbles) and 16..31 (high nibbles).
inline void nibbles32(const uint8_t* p, v16f& lo, v16f& hi) {
#if defined(__AVX512F__)
    // Each byte widened to a 32-bit lane: its low nibble by a mask, its high one by a shift.
    const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m512 l = _mm512_cvtepi32_ps(_mm512_and_si512(d, _mm512_set1_epi32(0x0f)));
    const __m512 h = _mm512_cvtepi32_ps(_mm512_srli_epi32(d, 4));
    std::memcpy(&lo, &l, 64);
    std::memcpy(&hi, &h, 64);
#elif defined(__AVX2__)
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i mask = _mm_set1_epi8(0x0f);
    const __m128i l8 = _mm_and_si128(b, mask), h8 = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
    const __m256 parts[4] = {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(l8)),
                             _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(l8, 8))),
                             _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(h8)),
                             _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(h8, 8)))};
    std::memcpy(&lo, parts, 64);
    std::memcpy(&hi, parts + 2, 64);
#else
    for (int l = 0; l < 16; ++l) {
        lo[l] = static_cast<float>(p[l] & 0x0f);
        hi[l] = static_cast<float>(p[l] >> 4);
    }
#endif
}

// The scales and offsets of up to 16 consecutive groups of one row, converted to floats together (one
// instruction each with AVX-512) into memory, from which each group's are broadcast by the load ports (a
// permute from a register took the shuffle port, which the nibbles' widening needs too).
struct GroupParams {
    alignas(64) float scale[16], offset[16];
    void load(const Weight& w, int64_t n, int64_t g0, int64_t count) {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
        const __m512 s = scales16(w, n, g0, count);
        _mm512_store_ps(scale, s);
        _mm512_store_ps(offset, offsets16(w, s, n, g0, count));
#else
        w.params(n, g0, count, scale, offset);
#endif
    }
    // Group j's (of those loaded) 32 weights: q * scale + offset.
    void apply(int64_t j, v16f& lo, v16f& hi) const {
        const v16f s = splat(scale[j]), m = splat(offset[j]);
        lo = fma16(lo, s, m);
        hi = fma16(hi, s, m);
    }
};

// Rows [n0, n1) of the output for M activation rows, R weight rows at a time (R x M accumulators in registers).
template <int R, int M, typename T>
void rows(T* y, int64_t y_stride, const float* xf, const Weight& w, int64_t n0, int64_t n1) {
    const int64_t row_bytes = w.Kp / 2, groups = w.Kp / 32;
    int64_t n = n0;
    for (; n + R <= n1; n += R) {
        v16f acc[R][M] = {};
        rill_simd::prefetch_block(w.packed + n * row_bytes, R * row_bytes);
        for (int64_t g0 = 0; g0 < groups; g0 += 16) {
            const int64_t count = std::min<int64_t>(16, groups - g0);
            GroupParams params[R];
            for (int r = 0; r < R; ++r) params[r].load(w, n + r, g0, count);
            for (int64_t j = 0; j < count; ++j) {
                const int64_t g = g0 + j;
                v16f lo[R], hi[R];
                for (int r = 0; r < R; ++r) {
                    nibbles32(w.packed + (n + r) * row_bytes + 16 * g, lo[r], hi[r]);
                    params[r].apply(j, lo[r], hi[r]);
                }
                for (int m = 0; m < M; ++m) {
                    v16f x_lo, x_hi;
                    std::memcpy(&x_lo, xf + m * w.Kp + 32 * g, sizeof x_lo);
                    std::memcpy(&x_hi, xf + m * w.Kp + 32 * g + 16, sizeof x_hi);
                    for (int r = 0; r < R; ++r) acc[r][m] = fma16(hi[r], x_hi, fma16(lo[r], x_lo, acc[r][m]));
                }
            }
        }
        for (int r = 0; r < R; ++r)
            for (int m = 0; m < M; ++m) store(y + m * y_stride + n + r, hsum(acc[r][m]));
    }
    if (n < n1) rows<1, M, T>(y, y_stride, xf, w, n, n1);
}

template <int M, typename T>
void gemv(T* y, int64_t y_stride, const float* xf, const Weight& w, int64_t N) {
    rill_simd::split_rows(N, [&](int64_t n0, int64_t n1) { rows<(M <= 4 ? 4 : 2), M, T>(y, y_stride, xf, w, n0, n1); });
}

template <typename T>
void run(T* y, int64_t y_stride, const T* x, int64_t x_stride, int64_t M, int64_t K, const Weight& w, int64_t N) {
    thread_local std::vector<float> buf;  // the activations as floats, zero past K (the weight's padding too)
    buf.assign(M * w.Kp, 0.0f);
    for (int64_t m = 0; m < M; ++m)
        for (int64_t k = 0; k < K; ++k) buf[m * w.Kp + k] = to_float(x[m * x_stride + k]);
    const float* xf = buf.data();
#ifdef RILL_INT4_VNNI
    vnni::run(y, y_stride, xf, M, w, N);  // int4_gemv_vnni.h
    return;
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    avx2::run(y, y_stride, xf, M, w, N);  // int4_gemv_avx2.h
    return;
#endif
    for (int64_t m = 0; m < M;) {  // eight rows a pass: each pass reads the whole weight
        T* out = y + m * y_stride;
        const float* in = xf + m * w.Kp;
        const int64_t rows_now = std::min<int64_t>(M - m, 8);
        rill_simd::with_rows(rows_now, [&](auto rows) { gemv<decltype(rows)::value, T>(out, y_stride, in, w, N); });
        m += rows_now;
    }
}

// The first `valid` (all 16 when at least 16) of v's lanes at p, rounded to T: vector stores where the build has
// them (scalar ones, one lane at a time, made the conversion for prompt steps the int4 path's slowest part).
inline void store16(float* p, v16f v, int64_t valid) {
    if (valid >= 16) {
        std::memcpy(p, &v, 64);
    } else {
        for (int64_t l = 0; l < valid; ++l) p[l] = v[l];
    }
}

inline void store16(uint16_t* p, v16f v, int64_t valid) {
#ifdef RILL_BF16_SIMD
    if (valid > 0) rill_simd::store_bf16(p, reinterpret_cast<__m512>(v), rill_simd::tail_mask(valid));
#else
    for (int64_t l = 0; l < std::min<int64_t>(valid, 16); ++l) store(p + l, v[l]);
#endif
}

template <typename T>
void dequant(T* out, int64_t K, const Weight& w, int64_t start, int64_t count) {
    const int64_t groups = (K + 31) / 32;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; ++i) {
        T* row = out + i * K;
        GroupParams params;
        for (int64_t g = 0; g < groups; ++g) {
            if (g % 16 == 0) params.load(w, start + i, g, std::min<int64_t>(16, groups - g));
            v16f lo, hi;
            nibbles32(w.packed + (start + i) * (w.Kp / 2) + 16 * g, lo, hi);
            params.apply(g % 16, lo, hi);
            store16(row + 32 * g, lo, K - 32 * g);
            store16(row + 32 * g + 16, hi, K - 32 * g - 16);
        }
    }
}

}  // namespace rill_int4

namespace rill_cpu {

namespace {

template <typename F>
auto by_dtype(const at::Tensor& t, const char* what, F&& call) {
    TORCH_CHECK(t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kFloat, what, ": float32 or bfloat16");
    return t.scalar_type() == at::kBFloat16 ? call(static_cast<uint16_t*>(nullptr)) : call(static_cast<float*>(nullptr));
}

}  // namespace

at::Tensor int4_gemv(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales, const at::Tensor& offsets,
                     int64_t in_features) {
    TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.size(1) == in_features, "int4_gemv: x [M, K], rows contiguous");
    const rill_int4::Weight w = rill_int4::weight_of(packed, scales, offsets, in_features);
    at::Tensor y = x.new_empty({x.size(0), packed.size(0)});
    by_dtype(x, "int4_gemv: x", [&](auto* typed) {
        using T = std::remove_pointer_t<decltype(typed)>;
        rill_int4::run<T>(static_cast<T*>(y.data_ptr()), y.stride(0), static_cast<const T*>(x.data_ptr()), x.stride(0),
                          x.size(0), in_features, w, packed.size(0));
        return 0;
    });
    return y;
}

at::Tensor int4_dequant(const at::Tensor& packed, const at::Tensor& scales, const at::Tensor& offsets,
                        int64_t in_features, int64_t start, int64_t count, const at::Tensor& like) {
    const rill_int4::Weight w = rill_int4::weight_of(packed, scales, offsets, in_features);
    TORCH_CHECK(start >= 0 && count >= 0 && start + count <= packed.size(0), "int4_dequant: rows out of range");
    at::Tensor out = like.new_empty({count, in_features});
    by_dtype(like, "int4_dequant: like", [&](auto* typed) {
        using T = std::remove_pointer_t<decltype(typed)>;
        rill_int4::dequant<T>(static_cast<T*>(out.data_ptr()), in_features, w, start, count);
        return 0;
    });
    return out;
}

at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                       const at::Tensor& offsets, int64_t in_features, int64_t gemv_max_rows, int64_t chunk_elems) {
    if (x.size(0) <= gemv_max_rows) return int4_gemv(x.stride(1) == 1 ? x : x.contiguous(), packed, scales, offsets, in_features);
    if (quant_panels_take(x, in_features)) return int4_linear_panels(x, packed, scales, offsets, in_features);
    const int64_t N = packed.size(0), rows_per_chunk = std::max<int64_t>(1, chunk_elems / in_features);
    auto linear = [](const at::Tensor& a, const at::Tensor& b) { return at::_ops::linear::call(a, b, std::nullopt); };
    if (N <= rows_per_chunk) return linear(x, int4_dequant(packed, scales, offsets, in_features, 0, N, x));
    at::Tensor y = x.new_empty({x.size(0), N});
    for (int64_t start = 0; start < N; start += rows_per_chunk) {
        const int64_t n = std::min(rows_per_chunk, N - start);
        y.narrow(1, start, n).copy_(linear(x, int4_dequant(packed, scales, offsets, in_features, start, n, x)));
    }
    return y;
}

}  // namespace rill_cpu
