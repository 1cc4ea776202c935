// Activations rounded to int8 per group of 32 for the AVX2 integer GEMVs (int4_gemv_avx2.h, int8_gemv_avx2.h), on
// CPUs without AVX512-VNNI: vpmaddubsw and vpmaddwd multiply them with the weights' bytes.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace rill_avx2 {

struct Int8Rows {  // per row, per group of 32: the int8 values in order (zero past the last), scale, scaled sum
    std::vector<int8_t> q;  // [M, G * 32]
    std::vector<float> scale, sum;  // [M, G]
    int64_t G = 0;
};

inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

inline int32_t hsum8i(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1)));
}

// Each group of 32 (the last maybe 16: K a multiple of 16) rounded to int8 against max|x| / 127 (round to nearest
// even, as the VNNI paths' quantize32).
inline void quantize_rows(const float* xf, int64_t M, int64_t K, Int8Rows& out) {
    const int64_t G = (K + 31) / 32;
    out.G = G;
    out.q.resize(M * G * 32);
    out.scale.resize(M * G);
    out.sum.resize(M * G);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undoes the packs' lane interleaving
    for (int64_t m = 0; m < M; ++m) {
        for (int64_t g = 0; g < G; ++g) {
            alignas(32) float tail[32] = {};
            const float* p = xf + m * K + 32 * g;
            if (32 * g + 32 > K) p = static_cast<const float*>(std::memcpy(tail, p, 4 * (K - 32 * g)));
            __m256 v[4];
            for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(p + 8 * i);
            __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                      _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
            const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
            __m256i q[4];
            for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
            const float scale = amax / 127.0f;
            out.scale[m * G + g] = scale;
            const __m256i total = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            out.sum[m * G + g] = scale * static_cast<float>(hsum8i(total));
            const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.q.data() + (m * G + g) * 32),
                                _mm256_permutevar8x32_epi32(bytes, order));
        }
    }
}

}  // namespace rill_avx2
