// The 4-bit GEMV's integer path for AVX2 CPUs without AVX512-VNNI (Haswell to Alder Lake, Zen 1-3), included by
// int4_gemv.cpp. The float path there widens each nibble to a float and scales it before the multiply, about 13
// instructions per 32 weights and activation row at 8 lanes, compute-bound well under the memory bandwidth. Here,
// as in llama.cpp's AVX2 Q4 x Q8 kernels, each activation row is rounded per group of 32 to int8 (as the VNNI
// path rounds it) and a group's 32 nibbles meet its 32 int8 activations in vpmaddubsw (unsigned x signed bytes to
// 16 pairs of int16) and vpmaddwd (to 8 int32), then one float FMA with the groups' scale products: per pair of
// groups and row, 7 instructions; the nibbles are unpacked once for all rows, 4 instructions a pair. The offsets' part comes from
// the rounded activations' sums, as in the VNNI path (int4_gemv_vnni.h's quantize_rows says why).
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "avx2_int8_rows.h"
#include "int4_gemv.h"
#include "simd16.h"

namespace rill_int4 {
namespace avx2 {

using rill_avx2::hsum8;
using rill_avx2::Int8Rows;

// A pair of groups' 64 nibbles as bytes: their 32 bytes' low nibbles (group g's elements 0-15, then g+1's), and
// their high ones (g's 16-31, g+1's 16-31): the order pair_order gives the activations.
inline void nibble_pair(const uint8_t* p, __m256i& lo, __m256i& hi) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i mask = _mm256_set1_epi8(0x0f);
    lo = _mm256_and_si256(b, mask);
    hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), mask);
}

// Each pair of groups' 64 activations from in-order (g's 0-31, g+1's 0-31) to nibble_pair's order.
inline void pair_order(Int8Rows& x) {
    for (int64_t i = 0; i + 64 <= static_cast<int64_t>(x.q.size()); i += 64) {
        __m256i* p = reinterpret_cast<__m256i*>(x.q.data() + i);
        const __m256i a = _mm256_loadu_si256(p), b = _mm256_loadu_si256(p + 1);
        _mm256_storeu_si256(p, _mm256_permute2x128_si256(a, b, 0x20));
        _mm256_storeu_si256(p + 1, _mm256_permute2x128_si256(a, b, 0x31));
    }
}

// Rows [n0, n1) of the output for M activation rows (x: M rows of Kp int8 values, G scales and sums each), R
// weight rows at a time.
template <int R, int M, typename T>
void rows(T* y, int64_t y_stride, const int8_t* xq, const float* xs, const float* xsum, const Weight& w,
          int64_t n0, int64_t n1) {
    const int64_t row_bytes = w.Kp / 2, G = w.Kp / 32;
    const __m256i ones = _mm256_set1_epi16(1);
    int64_t n = n0;
    for (; n + R <= n1; n += R) {
        __m256 acc[R][M];
        float offset_part[R][M] = {};
        for (int r = 0; r < R; ++r)
            for (int m = 0; m < M; ++m) acc[r][m] = _mm256_setzero_ps();
        rill_simd::prefetch_block(w.packed + n * row_bytes, R * row_bytes);
        const uint8_t* next = w.packed + (n + R) * row_bytes;  // the next block's rows, as the VNNI kernel's
        const int64_t next_bytes = std::min<int64_t>(R, n1 - n - R) * row_bytes;
        for (int64_t g0 = 0; g0 < G; g0 += 8) {
            const int64_t count = std::min<int64_t>(8, G - g0);
            alignas(32) float combined[R][M][8];  // per group: the weight's scale times the activations'
            // Eight groups' parameters at once; the last few of a row through zeroed copies (memcpy with a
            // variable length is a call: per group, it had cost more than the dot products).
            // Two-level weights (Q4_K's codes): the eight groups are one super-block, one d and dmin. A row's last
            // groups and groups of 128 (one scale for four groups) through the scalar Weight::params.
            const bool whole = count == 8;
            for (int r = 0; r < R; ++r) {
                __m256 sw, ow;
                if (w.codes) {
                    const uint8_t* row = w.codes + (n + r) * w.P;
                    const auto codes = [](const uint8_t* c) {
                        const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(c));
                        return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
                    };
                    uint16_t d[2];
                    std::memcpy(d, row + G + 4 * (g0 / 8), 4);
                    sw = _mm256_mul_ps(codes(row + g0), _mm256_set1_ps(half_to_float(d[0])));
                    ow = _mm256_mul_ps(codes(w.min_codes + (n + r) * G + g0), _mm256_set1_ps(-half_to_float(d[1])));
                } else if (whole && w.shift == 0) {
                    const auto* ps = reinterpret_cast<const __m128i*>(w.scales + (n + r) * G + g0);
                    sw = _mm256_cvtph_ps(_mm_loadu_si128(ps));
                    if (w.offsets) {
                        const auto* po = reinterpret_cast<const __m128i*>(w.offsets + (n + r) * G + g0);
                        ow = _mm256_cvtph_ps(_mm_loadu_si128(po));
                    } else {
                        ow = _mm256_mul_ps(sw, _mm256_set1_ps(-8.0f));  // symmetric
                    }
                } else {
                    alignas(32) float sf[8] = {}, of[8] = {};
                    w.params(n + r, g0, count, sf, of);
                    sw = _mm256_load_ps(sf);
                    ow = _mm256_load_ps(of);
                }
                for (int m = 0; m < M; ++m) {
                    const float *px = xs + m * G + g0, *pm = xsum + m * G + g0;
                    float sx[8] = {}, sum[8] = {};
                    if (!whole) {
                        std::memcpy(sx, px, 4 * count);
                        std::memcpy(sum, pm, 4 * count);
                    }
                    _mm256_store_ps(combined[r][m], _mm256_mul_ps(sw, _mm256_loadu_ps(whole ? px : sx)));
                    offset_part[r][m] += hsum8(_mm256_mul_ps(ow, _mm256_loadu_ps(whole ? pm : sum)));
                }
            }
            for (int64_t j = 0; j < count; j += 2) {  // a pair of groups: count is even (Kp a multiple of 64)
                const int64_t g = g0 + j;
                // Lanes 0-3 hold group g's sums, 4-7 group g+1's: the pair's scales by index.
                const __m256i lanes = _mm256_setr_epi32(j, j, j, j, j + 1, j + 1, j + 1, j + 1);
                __m256i lo[R], hi[R];
                for (int r = 0; r < R; ++r) nibble_pair(w.packed + (n + r) * row_bytes + 16 * g, lo[r], hi[r]);
                if (g % 4 == 0)
                    for (int r = 0; r < R; ++r)
                        if (r * row_bytes < next_bytes) __builtin_prefetch(next + r * row_bytes + 16 * g, 0, 3);
                for (int m = 0; m < M; ++m) {
                    const __m256i* xv = reinterpret_cast<const __m256i*>(xq + m * w.Kp + 32 * g);
                    const __m256i x_lo = _mm256_loadu_si256(xv), x_hi = _mm256_loadu_si256(xv + 1);
                    for (int r = 0; r < R; ++r) {
                        // int16 pairs of both halves added (at most 4 x 15 x 127), then to int32
                        const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo[r], x_lo),
                                                               _mm256_maddubs_epi16(hi[r], x_hi));
                        const __m256 scale = _mm256_permutevar8x32_ps(_mm256_load_ps(combined[r][m]), lanes);
                        acc[r][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones)), scale, acc[r][m]);
                    }
                }
            }
        }
        for (int r = 0; r < R; ++r)
            for (int m = 0; m < M; ++m) rill_float::store(y + m * y_stride + n + r, hsum8(acc[r][m]) + offset_part[r][m]);
    }
    if (n < n1) rows<1, M, T>(y, y_stride, xq, xs, xsum, w, n, n1);
}

template <int M, typename T>
void gemv(T* y, int64_t y_stride, const Int8Rows& x, int64_t m0, const Weight& w, int64_t N) {
    const int64_t G = w.Kp / 32;
    const int8_t* xq = x.q.data() + m0 * w.Kp;
    const float *xs = x.scale.data() + m0 * G, *xsum = x.sum.data() + m0 * G;
    rill_simd::split_rows(N, [&](int64_t n0, int64_t n1) {
        rows<(M <= 2 ? 4 : 2), M, T>(y + m0 * y_stride, y_stride, xq, xs, xsum, w, n0, n1);
    });
}

template <typename T>
void run(T* y, int64_t y_stride, const float* xf, int64_t M, const Weight& w, int64_t N) {
    thread_local Int8Rows qx;
    rill_avx2::quantize_rows(xf, M, w.Kp, qx);
    pair_order(qx);
    for (int64_t m = 0; m < M;) {  // eight rows a pass: each pass reads the whole weight
        const int64_t rows_now = std::min<int64_t>(M - m, 8);
        rill_simd::with_rows(rows_now, [&](auto rows) { gemv<decltype(rows)::value, T>(y, y_stride, qx, m, w, N); });
        m += rows_now;
    }
}

}  // namespace avx2
}  // namespace rill_int4
