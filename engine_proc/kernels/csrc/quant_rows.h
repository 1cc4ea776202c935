// The quantized weights' rows as bfloat16, 32 along K at a time: what quant_panels.cpp (brgemm over 64-column
// panels) and quant_tiles.h (AMX tiles, the weight as the A operand) unpack in cache before their products.
//
// For one weight row and one group of 32 along K, pairs_of() gives the 32 values as 16 bfloat16 pairs, k in
// order (int4: q * scale + offset in float32, then rounded, the GEMV's and the dequantization's own values; int8:
// q itself, exact, its row's scale applied to the output). transpose16() turns 16 such rows into 16 columns of
// pairs, brgemm's panel layout.
#pragma once

#include "bf16_simd.h"

#ifdef RILL_BF16_SIMD
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "int4_gemv.h"
#include "simd16.h"

namespace rill_quant_rows {

// 32 floats (lo: k = 0..15, hi: 16..31) as 16 bfloat16 pairs, k in order.
inline __m512i pairs(__m512 lo, __m512 hi) { return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)); }

// r[i] (row i of a 16 x 16 matrix of 32-bit lanes) becomes column i.
inline void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {  // r[4i + c], lane L: column 4L + c of rows 4i..4i+3
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

// A 4-bit weight's rows: for a block of 16, their scales and offsets as floats (16 x groups, reused), converted
// 16 at a time (one at a time, the conversion cost about a third of the unpacking).
struct Int4Rows {
    rill_int4::Weight w;
    int64_t groups;
    float* params;  // 2 * 16 * groups floats
    void begin(int64_t n0, int64_t live) {
        float *scale = params, *offset = params + 16 * groups;
        for (int64_t j = 0; j < 16; ++j)
            for (int64_t g = 0; g < groups; g += 16) {
                const int64_t count = j < live ? std::min<int64_t>(16, groups - g) : 0;
                const __m512 s = rill_int4::scales16(w, n0 + j, g, count);
                _mm512_mask_storeu_ps(scale + j * groups + g, rill_simd::tail_mask(groups - g), s);
                _mm512_mask_storeu_ps(offset + j * groups + g, rill_simd::tail_mask(groups - g),
                                      rill_int4::offsets16(w, s, n0 + j, g, count));
            }
    }
    void prefetch_ahead(int64_t n, int64_t g) const {  // 16 groups past group g of row n, to L1 only
        if (g % 4 == 0) __builtin_prefetch(w.packed + n * (w.Kp / 2) + 16 * g + 256, 0, 0);
    }
    void prefetch_row(int64_t n) const {  // to L2: row n's nibbles, scales and offsets
        rill_simd::prefetch_lines(w.packed + n * (w.Kp / 2), w.Kp / 2);
        if (w.codes) {
            rill_simd::prefetch_lines(w.codes + n * w.P, w.P);
            rill_simd::prefetch_lines(w.min_codes + n * (w.Kp / 32), w.Kp / 32);
        } else {
            rill_simd::prefetch_lines(w.scales + n * w.P, 2 * w.P);
            if (w.offsets) rill_simd::prefetch_lines(w.offsets + n * w.P, 2 * w.P);
        }
    }
    // Row n0 + j, group g, through a table: the 16 values q * scale + offset (float32, then rounded) as bfloat16,
    // twice over, so that word i and 16 + i both hold q = i; one vpermw then looks up all 32 nibbles, widened to
    // words. A low nibble's word is its whole byte: of its low 5 bits, the 5th (the high nibble's lowest) only
    // picks the table's other copy. 6 instructions on the vector ports where converting each value took 9.
    __m512i pairs_of(int64_t n0, int64_t j, int64_t g) const {
        const uint8_t* p = w.packed + (n0 + j) * (w.Kp / 2) + 16 * g;
        const __m512 q = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        const __m512 v = _mm512_fmadd_ps(q, _mm512_set1_ps(params[j * groups + g]),
                                         _mm512_set1_ps(params[(16 + j) * groups + g]));
        const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
        const __m512i b = _mm512_cvtepu8_epi16(_mm256_broadcastsi128_si256(bytes));
        return _mm512_permutexvar_epi16(_mm512_mask_srli_epi16(b, 0xffff0000, b, 4), pairs(v, v));
    }
};

// An int8 weight's rows [N, Kp]: q itself (the scales go to the output).
struct Int8Rows {
    const int8_t* w;
    int64_t Kp;
    void begin(int64_t, int64_t) {}
    void prefetch_ahead(int64_t n, int64_t g) const {
        if (g % 2 == 0) __builtin_prefetch(w + n * Kp + 32 * g + 512, 0, 0);
    }
    void prefetch_row(int64_t n) const { rill_simd::prefetch_lines(w + n * Kp, Kp); }
    __m512i pairs_of(int64_t n0, int64_t j, int64_t g) const {
        const int8_t* p = w + (n0 + j) * Kp + 32 * g;
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
        return pairs(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q))),
                     _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1))));
    }
};

}  // namespace rill_quant_rows
#endif
