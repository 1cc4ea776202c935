// Weight-only 4-bit linears (int4_gemv.cpp): the operators rill_cpu::int4_gemv, rill_cpu::int4_dequant and
// rill_cpu::int4_linear, whose schemas bindings.cpp registers.
//
// The layout (engine_proc/kernels/int4_linear.py makes it, from a float weight or a GGUF Q4_0/Q4_1/Q4_K
// tensor): a weight [N, K] in groups of 32 along K, K padded with zeros to Kp, a multiple of 64 (whole pairs of
// groups, which the AVX512-VNNI kernel takes at once).
//   packed  uint8 [N, Kp / 2]: group g of row n is bytes 16g..16g+15; byte j holds element 32g + j in its
//           low four bits and element 32g + 16 + j in its high four (GGUF's Q4_0 and Q4_1 order);
//   scales  float16 [N, P] and offsets float16 [N, P]: w = q * scale + offset, q in 0..15, one scale and offset
//           per group of 32 (P = Kp / 32) or of 128 (P = Kp / 128 rounded up: group g's are entry g / 4);
//           offsets [N, 0]: symmetric, offset = -8 * scale (GGUF's Q4_0), half a bit a weight less;
//   or two-level, as GGUF's Q4_K (4.625 bits a weight): scales uint8 [N, G + G / 2], each group's 6-bit scale code
//           then per 8 groups float16 d and dmin; offsets uint8 [N, G], the minimums' codes: scale = d * code,
//           offset = -dmin * min code, both exact in float32.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <cstring>
#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace rill_int4 {

inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
    if (exp == 0x1fu) {
        bits = sign | 0x7f800000u | (mant << 13);  // inf, NaN
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else {  // subnormal: normalize
        exp = 113u;
        while (!(mant & 0x400u)) {
            mant <<= 1;
            --exp;
        }
        bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
#endif
}

struct Weight {
    const uint8_t* packed;  // [N, Kp / 2]
    const uint16_t* scales;  // [N, P] float16 bits (null: two-level)
    const uint16_t* offsets;  // [N, P], or null: symmetric
    int64_t Kp;
    int shift;  // log2 of the groups of 32 a scale covers: 0 or 2 (groups of 128)
    int64_t P;  // scales a row (two-level: bytes a row of `codes`)
    const uint8_t* codes = nullptr;  // two-level (Q4_K's): [N, P] bytes, G scale codes then G / 8 (d, dmin) float16
    const uint8_t* min_codes = nullptr;  // two-level: [N, G]
    // Row n's scales and offsets of groups g0..g0+count-1 (count <= 16) as floats, one a group, into scale[0..count)
    // and offset[0..count): a scalar loop (the AVX-512 kernels take scales16() and offsets16()).
    void params(int64_t n, int64_t g0, int64_t count, float* scale, float* offset) const {
        const int64_t G = Kp / 32;
        for (int64_t l = 0; l < count; ++l) {
            const int64_t g = g0 + l;
            if (codes) {  // exact in float32: a float16 times a 6-bit code
                const uint8_t* row = codes + n * P;
                uint16_t d[2];
                std::memcpy(d, row + G + 4 * (g / 8), 4);
                scale[l] = half_to_float(d[0]) * static_cast<float>(row[g]);
                offset[l] = -half_to_float(d[1]) * static_cast<float>(min_codes[n * G + g]);
            } else {
                scale[l] = half_to_float(scales[n * P + (g >> shift)]);
                offset[l] = offsets ? half_to_float(offsets[n * P + (g >> shift)]) : -8.0f * scale[l];
            }
        }
    }
};

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
inline __mmask16 mask16(int64_t k) { return static_cast<__mmask16>((1u << k) - 1u); }

// Two-level: groups g0..g0+15's super-block factors (d, or dmin with `second`) spread over their 8 groups each.
inline __m512 supers16(const Weight& w, int64_t n, int64_t g0, int64_t count, int second) {
    const uint8_t* row = w.codes + n * w.P + w.Kp / 32 + 4 * (g0 / 8);
    const __m512 v = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask16(2 * ((count + 7) / 8)), row));  // d, dmin, ...
    const __m512i lanes = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
    return _mm512_permutexvar_ps(_mm512_add_epi32(lanes, _mm512_set1_epi32(second)), v);
}

inline __m512 codes16(const uint8_t* p, int64_t count) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mask16(count), p)));
}

// Row n's float16 scales or offsets (p: w.scales or w.offsets) of groups g0..g0+count-1 as floats, zero past count:
// one masked load and conversion, and for groups of 128 a permute spreading each over its 4 groups.
inline __m512 halves16(const Weight& w, const uint16_t* p, int64_t n, int64_t g0, int64_t count) {
    const uint16_t* row = p + n * w.P;
    if (w.shift == 0) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask16(count), row + g0));
    const int64_t first = g0 >> w.shift, live = ((g0 + count - 1) >> w.shift) - first + 1;
    const __m512 v = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask16(live), row + first));
    const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm512_maskz_permutexvar_ps(mask16(count), _mm512_srli_epi32(lanes, w.shift), v);
}

// Row n's scales of groups g0..g0+count-1 (g0 a multiple of 16, count <= 16) as floats, zero past count: the float16
// ones (halves16), or for two-level weights the codes times their super-blocks' d.
inline __m512 scales16(const Weight& w, int64_t n, int64_t g0, int64_t count) {
    if (w.codes) return _mm512_mul_ps(codes16(w.codes + n * w.P + g0, count), supers16(w, n, g0, count, 0));
    return halves16(w, w.scales, n, g0, count);
}

// The same groups' offsets, given their scales: the stored ones, -8 * scale (symmetric), or -dmin * code.
inline __m512 offsets16(const Weight& w, __m512 scales, int64_t n, int64_t g0, int64_t count) {
    if (w.codes)
        return _mm512_mul_ps(codes16(w.min_codes + n * (w.Kp / 32) + g0, count),
                             _mm512_sub_ps(_mm512_setzero_ps(), supers16(w, n, g0, count, 1)));
    return w.offsets ? halves16(w, w.offsets, n, g0, count) : _mm512_mul_ps(scales, _mm512_set1_ps(-8.0f));
}
#endif

// The layout's pointers, checked, from the scales' and offsets' shapes and types: float16 scales [N, Kp / 32]
// (groups of 32) or [N, Kp / 128 rounded up] (of 128), with offsets of the same shape or [N, 0] (symmetric); or
// two-level, uint8 scales [N, G + G / 2] (G = Kp / 32 codes, then G / 8 pairs of float16 d and dmin) and uint8
// offsets [N, G].
inline Weight weight_of(const at::Tensor& packed, const at::Tensor& scales, const at::Tensor& offsets,
                        int64_t in_features) {
    const int64_t N = packed.size(0), Kp = packed.size(1) * 2, G = Kp / 32;
    TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 2 && packed.is_contiguous() && Kp % 64 == 0 &&
                    Kp >= in_features && Kp < in_features + 64,
                "int4: a packed uint8 weight [N, Kp / 2], Kp the in_features rounded up to 64, contiguous");
    const int64_t P = scales.dim() == 2 ? scales.size(1) : -1;
    if (scales.scalar_type() == at::kByte) {
        TORCH_CHECK(scales.is_contiguous() && scales.size(0) == N && G % 8 == 0 && P == G + G / 2 &&
                        offsets.scalar_type() == at::kByte && offsets.is_contiguous() && offsets.dim() == 2 &&
                        offsets.size(0) == N && offsets.size(1) == G,
                    "int4, two-level: uint8 scales [N, G + G / 2] and offsets [N, G], G = Kp / 32 a multiple of 8");
        Weight w{packed.data_ptr<uint8_t>(), nullptr, nullptr, Kp, 0, P};
        w.codes = scales.data_ptr<uint8_t>();
        w.min_codes = offsets.data_ptr<uint8_t>();
        return w;
    }
    TORCH_CHECK(scales.scalar_type() == at::kHalf && scales.is_contiguous() && scales.size(0) == N &&
                    (P == G || P == (Kp + 127) / 128),
                "int4: float16 scales [N, Kp / 32] (groups of 32) or [N, Kp / 128 rounded up] (of 128), contiguous");
    TORCH_CHECK(offsets.scalar_type() == at::kHalf && offsets.is_contiguous() && offsets.dim() == 2 &&
                    offsets.size(0) == N && (offsets.size(1) == P || offsets.size(1) == 0),
                "int4: float16 offsets shaped as the scales, or [N, 0] (symmetric), contiguous");
    return {packed.data_ptr<uint8_t>(), reinterpret_cast<const uint16_t*>(scales.data_ptr()),
            offsets.size(1) ? reinterpret_cast<const uint16_t*>(offsets.data_ptr()) : nullptr, Kp, P == G ? 0 : 2, P};
}

}  // namespace rill_int4

namespace rill_cpu {

// x [M, K] (float32 or bfloat16, rows contiguous) @ w.T, every weight read once per 8 rows.
at::Tensor int4_gemv(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                     const at::Tensor& offsets, int64_t in_features);
// Rows [start, start + count) of w as `like`'s dtype: [count, in_features].
at::Tensor int4_dequant(const at::Tensor& packed, const at::Tensor& scales, const at::Tensor& offsets,
                        int64_t in_features, int64_t start, int64_t count, const at::Tensor& like);
// The GEMV up to gemv_max_rows rows; above, int4_linear_panels (quant_panels.h) where it takes x, else w converted to x's dtype,
// chunk_elems at a time, and oneDNN's GEMM (engine_proc/kernels/int4_linear.py passes both figures).
at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                       const at::Tensor& offsets, int64_t in_features, int64_t gemv_max_rows, int64_t chunk_elems);


}  // namespace rill_cpu
