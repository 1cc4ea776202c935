// 16-float helpers the weight-only GEMV kernels share (int8_gemv.cpp, int4_gemv.cpp): a fused multiply-add
// spelled out, a broadcast, a horizontal sum, and the split of a weight's rows among OpenMP threads.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "float_bits.h"
#ifdef _OPENMP
#include <omp.h>
#endif

namespace rill_simd {

using rill_float::v16f;

// a * b + c, fused where the CPU has FMA: spelled out, so that every instance (each M, R) rounds
// the same way and an output does not depend on how many rows came with it.
inline v16f fma16(v16f a, v16f b, v16f c) {
#if defined(__AVX512F__)
    return reinterpret_cast<v16f>(_mm512_fmadd_ps(reinterpret_cast<__m512>(a), reinterpret_cast<__m512>(b),
                                                  reinterpret_cast<__m512>(c)));
#elif defined(__FMA__)
    __m256 a2[2], b2[2], c2[2];
    std::memcpy(a2, &a, sizeof a);
    std::memcpy(b2, &b, sizeof b);
    std::memcpy(c2, &c, sizeof c);
    const __m256 r[2] = {_mm256_fmadd_ps(a2[0], b2[0], c2[0]), _mm256_fmadd_ps(a2[1], b2[1], c2[1])};
    v16f out;
    std::memcpy(&out, r, sizeof out);
    return out;
#else
    return a * b + c;  // no FMA here: nothing to contract into
#endif
}

inline v16f splat(float s) {  // one broadcast (a lane-by-lane loop became 16 masked moves; v16f{} + s, an add)
#if defined(__AVX512F__)
    const __m512 v = _mm512_set1_ps(s);
#elif defined(__AVX__)
    const __m256 h = _mm256_set1_ps(s), v[2] = {h, h};
#else
    float v[16];
    for (float& l : v) l = s;
#endif
    v16f out;
    std::memcpy(&out, &v, 64);
    return out;
}

inline float hsum(v16f v) {
    float s = 0.0f;
    for (int l = 0; l < 16; ++l) s += v[l];
    return s;
}

#if defined(__AVX512F__)
// A group of 32 activations (lo: its first 16, hi: the rest) rounded to int8 against the group's max |x| / 127, as
// llama.cpp's Q8 rows are: the two halves' int8 values (to the nearest, ties to even, as std::nearbyint; |q| <= 127),
// and the group's max |x|. The quantized GEMVs' (int8_gemv.cpp, int4_gemv.cpp) activations for vpdpbusd.
inline float quantize32(__m512 lo, __m512 hi, __m128i& q_lo, __m128i& q_hi) {
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
    const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    q_lo = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(lo, inv)));
    q_hi = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(hi, inv)));
    return amax;
}
#endif

// The bytes a block of weight rows is about to read, requested a cache line each before the first is used, so
// that the memory works on all of them at once. On a Zen 4 this streamed a weight 1.6-1.9x faster than
// prefetching 16 rows ahead (what the GEMVs did before) or leaving it to the hardware: Qwen2.5-1.5B's head in int8
// at one row, 5.7 against 9.0 and 10.6 ms; in int4, 6.1 against 11.3 and 10.1 ms (interleaved in one process).
inline void prefetch_block(const void* p, int64_t bytes) {
    const char* c = static_cast<const char*>(p);
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(c + b, 0, 3);
}

// The same to L2 (prefetcht1): what a kernel reads a while later, after the block it works on now.
inline void prefetch_lines(const void* p, int64_t bytes) {
    const char* c = static_cast<const char*>(p);
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(c + b, 0, 2);
}

// f(std::integral_constant<int, m>{}) with m = rows, 1 to 8 (more: 8): a kernel's row count, a template argument
// (its accumulators stay in registers), chosen at run time. The GEMVs take up to eight rows a pass.
template <typename F>
void with_rows(int64_t rows, F&& f) {
    switch (rows) {
        case 1: f(std::integral_constant<int, 1>{}); break;
        case 2: f(std::integral_constant<int, 2>{}); break;
        case 3: f(std::integral_constant<int, 3>{}); break;
        case 4: f(std::integral_constant<int, 4>{}); break;
        case 5: f(std::integral_constant<int, 5>{}); break;
        case 6: f(std::integral_constant<int, 6>{}); break;
        case 7: f(std::integral_constant<int, 7>{}); break;
        default: f(std::integral_constant<int, 8>{}); break;
    }
}

// body(n0, n1) on each OpenMP thread: contiguous ranges of whole 16-row blocks of N rows, so that each
// thread streams its own part of the weight. One block runs on the calling thread alone (no team to wake).
template <typename F>
void split_rows(int64_t N, F&& body) {
    const int64_t blocks = (N + 15) / 16;
#pragma omp parallel if (blocks > 1)
    {
        int64_t t = 0, nt = 1;
#ifdef _OPENMP
        t = omp_get_thread_num();
        nt = omp_get_num_threads();
#endif
        const int64_t n0 = blocks * t / nt * 16, n1 = std::min(N, blocks * (t + 1) / nt * 16);
        if (n0 < n1) body(n0, n1);
    }
}

// The integer GEMVs' walk over a weight [N rows of row_bytes] for M activation rows: each thread's share
// (split_rows), about 32 KiB of weight rows at a time, into every 8 activation rows in turn, so that the weight
// comes from memory once, for the first 8, and from the cache for the rest (eight rows a pass over the whole weight
// read it again for each 8: Qwen2.5-1.5B's int4 layers on a 2-core Xeon took 94 ms at 12 rows against 81). Calls
// body(b0, b1, n_end, m, rows): weight rows [b0, b1) of the thread's rows up to n_end (to prefetch past the block),
// activation rows [m, m + rows), rows an integral_constant of 1-8 (with_rows).
template <typename F>
void row_blocks(int64_t N, int64_t row_bytes, int64_t M, F&& body) {
    const int64_t block = std::max<int64_t>(4, (32 << 10) / row_bytes / 4 * 4);
    split_rows(N, [&](int64_t n0, int64_t n1) {
        for (int64_t b = n0; b < n1; b += block)
            for (int64_t m = 0; m < M; m += 8)
                with_rows(std::min<int64_t>(M - m, 8), [&](auto rows) { body(b, std::min(b + block, n1), n1, m, rows); });
    });
}

#if defined(__AVX512BW__)
// The first n of 64 bytes (none when n <= 0, all from 64): a masked load's tail.
inline __mmask64 byte_mask(int64_t n) { return n >= 64 ? ~uint64_t{0} : n <= 0 ? 0 : (uint64_t{1} << n) - 1; }
#endif

}  // namespace rill_simd
