// 16-lane float helpers for CPUs with AVX-512 BF16 (every CPU with AMX has it; so do Zen 4 and
// Cooper Lake): e^x, SiLU(gate) * up, RoPE, and bfloat16 in and out. RILL_BF16_SIMD says whether this
// build has them; the code that uses them keeps a scalar loop for the other builds.
//
// Rounding to bfloat16 is the hardware's (vcvtneps2bf16: to nearest even, as torch rounds, except
// that it flushes subnormal floats, below 1.2e-38, to zero).
#pragma once
#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define RILL_BF16_SIMD 1
#include <immintrin.h>

#include <cstdint>

namespace rill_simd {

// The first `remaining` of 16 lanes (all 16 when at least 16 remain): a loop's tail.
inline __mmask16 tail_mask(int64_t remaining) {
    return remaining >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << remaining) - 1);
}

inline __m512 load_bf16(const uint16_t* p, __mmask16 m = 0xffff) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

inline __m256i to_bf16(__m512 x) { return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x)); }

inline void store_bf16(uint16_t* p, __m512 x, __mmask16 m = 0xffff) { _mm256_mask_storeu_epi16(p, m, to_bf16(x)); }

// x rounded to bfloat16 and back: what a bfloat16 tensor between two ops would hold.
inline __m512 round_bf16(__m512 x) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(to_bf16(x)), 16));
}

// 2^t to about 3e-6 relative (a degree-4 fit of 2^f on [-0.5, 0.5]; what it feeds is rounded to
// bfloat16, whose steps are 4e-3); e^x is 2^(x * log2(e)), the factor folded into the caller's
// own multiply. Past the float range scalef gives 0 (t below about -150) or +inf, so no clamp.
// Fewer operations than float_bits.h's exp_clamped (a degree-6 Cephes polynomial, both clamps),
// which measured a sixth of a 512-token prompt's attention time.
inline __m512 exp2_16(__m512 t) {
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, n);
    __m512 q = _mm512_set1_ps(9.560510206e-03f);
    q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(5.591703917e-02f));
    q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(2.402498111e-01f));
    q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(6.931219677e-01f));
    q = _mm512_fmadd_ps(q, f, _mm512_set1_ps(9.999991909e-01f));
    return _mm512_scalef_ps(q, n);
}

// silu(g) * u = g / (1 + e^-g) * u, e^-g as 2^(g * -log2(e)) (the bits of e^x with a clamp at -87,
// as 1 + e^-g is 1 either way past it). elementwise.cpp's silu_mul and amx_linear.cpp's fused
// gate_up epilogue both call this, so the two give the same bits.
inline __m512 silu_mul(__m512 g, __m512 u) {
    const __m512 e = exp2_16(_mm512_mul_ps(g, _mm512_set1_ps(-1.44269504088896341f)));
    return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

// One step of rotate-half RoPE on 16 lanes: (x1, x2) -> (x1 c - x2 s, x2 c + x1 s). elementwise.cpp's
// rope_ and amx_linear.cpp's fused qkv epilogue both call this, so the two give the same bits.
inline void rope16(__m512 x1, __m512 x2, __m512 c, __m512 s, __m512& y1, __m512& y2) {
    y1 = _mm512_sub_ps(_mm512_mul_ps(x1, c), _mm512_mul_ps(x2, s));
    y2 = _mm512_add_ps(_mm512_mul_ps(x2, c), _mm512_mul_ps(x1, s));
}

}  // namespace rill_simd
#endif
