// The int8 GEMV's integer path for AVX2 CPUs without AVX512-VNNI, bfloat16 activations (float32 keeps the exact
// float path), included by int8_gemv.cpp. The float path widens and converts every weight, and was the slowest
// part of an AVX2 decode step: Qwen2.5-1.5B's int8 head alone took about 33 ms. As llama.cpp's AVX2 Q8_0 x Q8_0
// kernel does, each activation row is rounded per group of 32 to int8 (avx2_int8_rows.h, the VNNI path's
// rounding); vpmaddubsw takes unsigned bytes on one side, so the activations go in as |x| and their signs move
// onto the weights (vpsignb; the weights are within +-127), then vpmaddwd, a conversion and one FMA with the
// group's scale per 32 weights and row. The row's own scale multiplies the sum.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "avx2_int8_rows.h"
#include "float_bits.h"
#include "simd16.h"

namespace rill_gemv {
namespace avx2 {

// 32 weights of a row from k, or the last 16 (the rest zero) where the row ends there: Kp is a multiple of 16.
inline __m256i weights32(const int8_t* p, int64_t k, int64_t Kp) {
    if (k + 32 <= Kp) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + k));
    return _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + k)));
}

template <int R, int M>
void rows(uint16_t* y, int64_t y_stride, const rill_avx2::Int8Rows& x, int64_t m0, const int8_t* w, int64_t Kp,
          const uint16_t* scale, int64_t n0, int64_t n1) {
    const int64_t G = x.G;
    const __m256i ones = _mm256_set1_epi16(1);
    int64_t n = n0;
    for (; n + R <= n1; n += R) {
        __m256 acc[R][M];
        for (int r = 0; r < R; ++r)
            for (int m = 0; m < M; ++m) acc[r][m] = _mm256_setzero_ps();
        const int8_t* w0 = w + n * Kp;
        rill_simd::prefetch_block(w0, R * Kp);
        const int64_t next_rows = std::min<int64_t>(R, n1 - n - R);  // and the next block's, as int4_gemv.cpp's
        for (int64_t g = 0; g < G; ++g) {
            __m256i wv[R];
            for (int r = 0; r < R; ++r) wv[r] = weights32(w0 + r * Kp, 32 * g, Kp);
            if (g % 2 == 0)
                for (int r = 0; r < next_rows; ++r) __builtin_prefetch(w0 + (R + r) * Kp + 32 * g, 0, 3);
            for (int m = 0; m < M; ++m) {
                const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q.data() + ((m0 + m) * G + g) * 32));
                const __m256i mag = _mm256_sign_epi8(xv, xv);
                const __m256 sx = _mm256_broadcast_ss(x.scale.data() + (m0 + m) * G + g);
                for (int r = 0; r < R; ++r) {
                    const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(mag, _mm256_sign_epi8(wv[r], xv)), ones);
                    acc[r][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), sx, acc[r][m]);
                }
            }
        }
        for (int r = 0; r < R; ++r) {
            const float s = rill_float::to_float(scale[n + r]);
            for (int m = 0; m < M; ++m) rill_float::store(y + m * y_stride + n + r, s * rill_avx2::hsum8(acc[r][m]));
        }
    }
    if (n < n1) rows<1, M>(y, y_stride, x, m0, w, Kp, scale, n, n1);
}

template <int M>
void gemv(uint16_t* y, int64_t y_stride, const rill_avx2::Int8Rows& x, int64_t m0, const int8_t* w, int64_t Kp,
          const uint16_t* scale, int64_t N) {
    rill_simd::split_rows(N, [&](int64_t n0, int64_t n1) {
        rows<(M <= 2 ? 4 : 2), M>(y + m0 * y_stride, y_stride, x, m0, w, Kp, scale, n0, n1);
    });
}

inline void run(uint16_t* y, int64_t y_stride, const float* xf, int64_t M, const int8_t* w, int64_t Kp,
                const uint16_t* scale, int64_t N) {
    thread_local rill_avx2::Int8Rows qx;
    rill_avx2::quantize_rows(xf, M, Kp, qx);
    for (int64_t m = 0; m < M;) {  // eight rows a pass: each pass reads the whole weight
        const int64_t now = std::min<int64_t>(M - m, 8);
        rill_simd::with_rows(now, [&](auto rows) { gemv<decltype(rows)::value>(y, y_stride, qx, m, w, Kp, scale, N); });
        m += now;
    }
}

}  // namespace avx2
}  // namespace rill_gemv
