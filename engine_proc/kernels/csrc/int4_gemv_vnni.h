// The 4-bit GEMV's integer path for AVX512-VNNI (Ice Lake and later, Zen 4), included by int4_gemv.cpp, whose run()
// calls vnni::run() where RILL_INT4_VNNI is defined.
#pragma once
#include "int4_gemv.h"

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "float_bits.h"
#include "simd16.h"

namespace rill_int4::vnni {

using rill_float::store;

// With AVX512-VNNI (Ice Lake and later, Zen 4): integer dot products, as llama.cpp's Q4 x Q8 kernels do.
// int4_gemv.cpp's float path spends about 13 instructions on 32 weights (widening, converting and scaling each
// nibble), which left it compute-bound at about a quarter of the memory bandwidth on a Zen 4 core. Here
// each activation row is quantized per group of 32 to int8 (scale max|x| / 127) and one vpdpbusd multiplies
// 64 nibbles by 64 int8 activations: per octet of groups (256 weights) and activation row, 7 instructions (rows_vnni).
// With w = q * s + o:
//   sum_k w_k x_k = s * sum_k q_k x_k + o * sum_k x_k ~= s * d_x * sum_k q_k xq_k + o * d_x * sum_k xq_k,
// both parts from the rounded activations (quantize_rows says why).
#define RILL_INT4_VNNI 1

// Activations per group: int8 values laid out to match an octet of weight groups as octet_nibbles() gives them,
// rows Ko apart (Kp rounded up to 256, zeros past Kp); per octet, the eight groups' scales each spread over the two
// lanes that hold that group's partial sums; per group, the sums. Where a row's last octet holds 2 or 4 groups
// (t), also one octet a row (256 bytes and 16 scales) of those t groups repeated 8 / t times: the tail octet that
// rows_vnni fills with the last t groups of 8 / t weight rows (tail_rows()).
struct QuantizedRows {
    std::vector<int8_t> q, tail_q;
    std::vector<float> scale, sum, tail_scale;
    int64_t Ko = 0;
};

// Groups in a row's last octet that tail_rows() takes with other rows' (2 or 4), or 0.
inline int64_t packed_tail(int64_t G) { return G % 8 == 2 || G % 8 == 4 ? G % 8 : 0; }

// Where element e of group gg (0-7) of an octet goes among its 256 bytes: vector t = 2 * (e / 16) + (e % 16) / 8 of
// the four, 128-bit lane gg % 4, its first 8 bytes for groups 0-3 and last 8 for 4-7.
inline int64_t octet_offset(int64_t gg, int64_t e) { return 64 * (2 * (e / 16) + e % 16 / 8) + 16 * (gg % 4) + 8 * (gg / 4); }

inline void quantize_rows(const float* xf, int64_t M, int64_t Kp, QuantizedRows& out) {
    const int64_t G = Kp / 32, O = (G + 7) / 8;
    out.Ko = 256 * O;
    out.q.assign(M * out.Ko, 0);
    out.scale.assign(M * O * 16, 0.0f);
    out.sum.resize(M * G);
    const int64_t t = packed_tail(G);
    out.tail_q.resize(t ? M * 256 : 0);
    out.tail_scale.resize(t ? M * 16 : 0);
    for (int64_t m = 0; m < M; ++m) {
        for (int64_t g = 0; g < G; ++g) {
            const __m512 lo = _mm512_loadu_ps(xf + m * Kp + 32 * g), hi = _mm512_loadu_ps(xf + m * Kp + 32 * g + 16);
            __m128i q_lo, q_hi;
            const float scale = rill_simd::quantize32(lo, hi, q_lo, q_hi) / 127.0f;
            const int64_t gg = g % 8;
            for (int l = 0; l < 2; ++l) out.scale[(m * O + g / 8) * 16 + 4 * (gg % 4) + 2 * (gg / 4) + l] = scale;
            // The sum of the rounded activations, as llama.cpp's Q8_1 keeps it: the error is then
            // sum_k w_k e_k (e_k: x_k's rounding), where the exact sum would leave sum_k (w_k - o) e_k, about
            // twice as large (q in 0..15 against w centred near 0). The bundled model's decode-path perplexity
            // on the same GGUF went from 1.014x llama.cpp's to 1.001x (bench/results/gguf_quality-*.md).
            const __m512i wide = _mm512_add_epi32(_mm512_cvtepi8_epi32(q_lo), _mm512_cvtepi8_epi32(q_hi));
            out.sum[m * G + g] = scale * static_cast<float>(_mm512_reduce_add_epi32(wide));
            int8_t* dst = out.q.data() + m * out.Ko + 256 * (g / 8);
            alignas(16) int8_t bytes[32];
            _mm_store_si128(reinterpret_cast<__m128i*>(bytes), q_lo);
            _mm_store_si128(reinterpret_cast<__m128i*>(bytes + 16), q_hi);
            for (int64_t e = 0; e < 32; e += 8) std::memcpy(dst + octet_offset(gg, e), bytes + e, 8);
            if (g < G - t) continue;
            for (int64_t slot = g - (G - t); slot < 8; slot += t) {  // this group in every t-th slot of the tail
                for (int l = 0; l < 2; ++l) out.tail_scale[m * 16 + 4 * (slot % 4) + 2 * (slot / 4) + l] = scale;
                for (int64_t e = 0; e < 32; e += 8)
                    std::memcpy(out.tail_q.data() + m * 256 + octet_offset(slot, e), bytes + e, 8);
            }
        }
    }
}

struct RowsView {  // some rows of a QuantizedRows
    const int8_t* q;
    const float* scale;
    const float* sum;
    int64_t Ko;
    const int8_t* tail_q;  // null: no packed tail
    const float* tail_scale;
};

// An octet of groups g..g+7 (128 packed bytes, of which the first `valid`: a row's last octet may hold 2, 4 or 6
// groups) as four vectors of bytes, d[t] holding elements 8t'..8t'+7 (t = 2 * half + t'; half 0: the low nibbles,
// elements 0-15, 1: the high ones) of every group, lanes 4k..4k+3 groups k (the first two lanes) and k + 4. One
// unpack of the two loads' qwords puts each group's bytes 0-7 (and 8-15) of both groups k and k + 4 in lane k; the
// nibbles split after. So four vpdpbusd sum each group's 32 products into two lanes of its own.
inline void split_nibbles(__m512i v0, __m512i v1, __m512i d[4]) {
    const __m512i u0 = _mm512_unpacklo_epi64(v0, v1), u1 = _mm512_unpackhi_epi64(v0, v1);
    const __m512i low = _mm512_set1_epi8(0x0f);
    d[0] = _mm512_and_si512(u0, low);
    d[1] = _mm512_and_si512(u1, low);
    d[2] = _mm512_and_si512(_mm512_srli_epi16(u0, 4), low);
    d[3] = _mm512_and_si512(_mm512_srli_epi16(u1, 4), low);
}

inline void octet_nibbles(const uint8_t* p, int64_t valid, __m512i d[4]) {
    const __m512i v0 = valid >= 64 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(rill_simd::byte_mask(valid), p);
    const __m512i v1 =
        valid >= 128 ? _mm512_loadu_si512(p + 64) : _mm512_maskz_loadu_epi8(rill_simd::byte_mask(valid - 64), p + 64);
    split_nibbles(v0, v1, d);
}

// The last t groups (2 or 4: packed_tail) of R weight rows, 8 / t rows an octet: slot s of the octet holds group
// G - t + s % t of row s / t, against x's tail octet. A row's last octet alone cost as much as a full one: the bundled
// model's rows (576 weights, 18 groups) took 3 octets for 2.25 octets of work, and 3,072 such rows a call 32.2 us
// against 22.5 for 512 weights; with the tails shared, 29.4 (2-core Xeon, AMX; 26.8 with no tail at all). Each
// row's sums are moved to the lanes its own last octet would give them (slots 0..t-1) and added there as rows_vnni
// adds them, so a row's output has the same bits whichever rows share its octet: it does not depend on the number
// of activation rows (which sets R).
struct TailLanes {  // for a tail of t groups (2 or 4), the first jt among its row's last load of 16 (8 or 0)
    __mmask16 live;  // the lanes a row's own last octet puts its t groups' sums in
    __m512i lanes;  // sw's entry for each lane (rows_vnni's octet_lanes + jt)
    __m512i from[4];  // row p of a tail octet: for each live lane, the lane that holds its sums

    TailLanes(int64_t t, int64_t jt) {
        // Lane L holds slot (L / 4) + 4 * ((L % 4) / 2) of an octet; slot s is in lanes 4 * (s % 4) + 2 * (s / 4)
        // and the next.
        const __m512i slot = _mm512_setr_epi32(0, 0, 4, 4, 1, 1, 5, 5, 2, 2, 6, 6, 3, 3, 7, 7);
        const __m512i own = _mm512_and_si512(slot, _mm512_set1_epi32(static_cast<int>(t - 1)));
        const __m512i pair = _mm512_setr_epi32(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1);  // L % 2
        live = _mm512_cmplt_epi32_mask(slot, _mm512_set1_epi32(static_cast<int>(t)));
        lanes = _mm512_add_epi32(slot, _mm512_set1_epi32(static_cast<int>(jt)));
        for (int p = 0; p < 4; ++p) {
            const __m512i s = _mm512_add_epi32(own, _mm512_set1_epi32(static_cast<int>(p * t) % 8));
            from[p] = _mm512_add_epi32(
                _mm512_add_epi32(_mm512_slli_epi32(_mm512_and_si512(s, _mm512_set1_epi32(3)), 2),
                                 _mm512_slli_epi32(_mm512_srli_epi32(s, 2), 1)),
                pair);
        }
    }
};

// t a template parameter, so that every loop over rows unrolls and acc stays in registers (with t at run time it
// went to the stack, and the tail cost as much as the octet it saves).
template <int R, int M, int t>
inline void tail_rows(__m512 (&acc)[R][M], const RowsView& x, const Weight& w, int64_t n, const TailLanes& tl,
                      const __m512 (&sw)[R], const uint8_t* next, int64_t next_bytes) {
    const int64_t row_bytes = w.Kp / 2, first = row_bytes - 16 * t;
    constexpr int per_octet = 8 / t;
    for (int r0 = 0; r0 < R; r0 += per_octet) {
        const auto bytes = [&](int r) { return w.packed + (n + r) * row_bytes + first; };
        __m512i v0, v1;
        if (t == 2) {
            const auto half = [&](int r) {
                return r < R ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes(r))) : _mm256_setzero_si256();
            };
            v0 = _mm512_inserti64x4(_mm512_castsi256_si512(half(r0)), half(r0 + 1), 1);
            v1 = _mm512_inserti64x4(_mm512_castsi256_si512(half(r0 + 2)), half(r0 + 3), 1);
        } else {
            v0 = _mm512_loadu_si512(bytes(r0));
            v1 = r0 + 1 < R ? _mm512_loadu_si512(bytes(r0 + 1)) : _mm512_setzero_si512();
        }
        __m512i d[4];
        split_nibbles(v0, v1, d);
        constexpr int rows_max = per_octet < R ? per_octet : R;
        __m512 s[4];
        for (int p = 0; p < rows_max; ++p) {
            s[p] = _mm512_permutexvar_ps(tl.lanes, sw[r0 + p]);
            if ((r0 + p) * row_bytes < next_bytes) __builtin_prefetch(next + (r0 + p) * row_bytes + first, 0, 3);
        }
        for (int m = 0; m < M; ++m) {
            const int8_t* xq = x.tail_q + 256 * m;
            __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), d[0], _mm512_loadu_si512(xq));
            dot = _mm512_dpbusd_epi32(dot, d[1], _mm512_loadu_si512(xq + 64));
            dot = _mm512_dpbusd_epi32(dot, d[2], _mm512_loadu_si512(xq + 128));
            dot = _mm512_dpbusd_epi32(dot, d[3], _mm512_loadu_si512(xq + 192));
            const __m512 sums = _mm512_cvtepi32_ps(dot), sx = _mm512_loadu_ps(x.tail_scale + 16 * m);
            for (int p = 0; p < rows_max; ++p)
                acc[r0 + p][m] = _mm512_mask3_fmadd_ps(_mm512_permutexvar_ps(tl.from[p], sums),
                                                       _mm512_mul_ps(s[p], sx), acc[r0 + p][m], tl.live);
        }
    }
}

// Per octet of groups and weight row, the integer sums are converted once and scaled by the weight's scales times the
// activations' (four vpdpbusd, then a conversion, a product and an FMA for 256 weights). Qwen2.5-1.5B's 28 layers on a
// 2-core Xeon, in one process: with a pair of groups a vector (each pair its own conversion, permute and FMA) 94 ms
// at 8 rows; with a quad (64 packed bytes, no unpack) 58; with the octet 51, and 73 against 85 at 12 rows. The
// offsets' part, offset times the activations' sum, goes into the same accumulators 16 groups at a time: all lanes
// are summed at the end.
template <int R, int M, typename T>
void rows_vnni(T* y, int64_t y_stride, const RowsView& x, const Weight& w, int64_t n0, int64_t n1, int64_t n_end) {
    const int64_t row_bytes = w.Kp / 2, G = w.Kp / 32, t = R > 1 && x.tail_q ? packed_tail(G) : 0;
    const TailLanes tail(t ? t : 2, (G - t) % 16);
    // Lane L of an octet's sums holds group (L / 4) + 4 * ((L % 4) / 2): its index among 16 groups' scales.
    const __m512i octet_lanes = _mm512_setr_epi32(0, 0, 4, 4, 1, 1, 5, 5, 2, 2, 6, 6, 3, 3, 7, 7);
    int64_t n = n0;
    for (; n + R <= n1; n += R) {
        __m512 acc[R][M];
        for (int r = 0; r < R; ++r)
            for (int m = 0; m < M; ++m) acc[r][m] = _mm512_setzero_ps();
        rill_simd::prefetch_block(w.packed + n * row_bytes, R * row_bytes);
        // And the next block's rows, two lines of each per octet of groups as these are read. Qwen2.5-1.5B's
        // shapes streamed from memory at one row, with against without, interleaved in one process (2-core Zen 4,
        // 2026-12-05): down_proj (8,960 columns) 0.80x the time, gate_up 0.93x, qkv 0.85x; int8_gemv.cpp's
        // the same way: 0.89x the gate_up, 0.90x the 151,936-row head, down_proj 0.99x.
        const uint8_t* next = w.packed + (n + R) * row_bytes;
        const int64_t next_bytes = std::clamp<int64_t>(n_end - n - R, 0, R) * row_bytes;
        for (int64_t g0 = 0; g0 < G; g0 += 16) {
            const int64_t count = std::min<int64_t>(16, G - g0);  // even: Kp is a multiple of 64
            const __mmask16 mask = static_cast<__mmask16>((1u << count) - 1u);
            __m512 sw[R];
            for (int r = 0; r < R; ++r) {
                sw[r] = scales16(w, n + r, g0, count);
                const __m512 ow = offsets16(w, sw[r], n + r, g0, count);
                for (int m = 0; m < M; ++m)
                    acc[r][m] = _mm512_fmadd_ps(ow, _mm512_maskz_loadu_ps(mask, x.sum + m * G + g0), acc[r][m]);
            }
            const int64_t octets_end = g0 + 16 >= G ? count - t : count;  // the tail's t groups: tail_rows()
            for (int64_t j = 0; j < octets_end; j += 8) {
                const int64_t g = g0 + j;
                const __m512i lanes = _mm512_add_epi32(octet_lanes, _mm512_set1_epi32(static_cast<int>(j)));
                __m512i d[R][4];
                __m512 s[R];
                for (int r = 0; r < R; ++r) {
                    octet_nibbles(w.packed + (n + r) * row_bytes + 16 * g, 16 * (count - j), d[r]);
                    s[r] = _mm512_permutexvar_ps(lanes, sw[r]);
                    if (r * row_bytes < next_bytes) {
                        __builtin_prefetch(next + r * row_bytes + 16 * g, 0, 3);
                        __builtin_prefetch(next + r * row_bytes + 16 * g + 64, 0, 3);
                    }
                }
                for (int m = 0; m < M; ++m) {
                    const int8_t* xq = x.q + m * x.Ko + 32 * g;
                    const __m512i x0 = _mm512_loadu_si512(xq), x1 = _mm512_loadu_si512(xq + 64),
                                  x2 = _mm512_loadu_si512(xq + 128), x3 = _mm512_loadu_si512(xq + 192);
                    const __m512 sx = _mm512_loadu_ps(x.scale + (m * (x.Ko / 256) + g / 8) * 16);
                    for (int r = 0; r < R; ++r) {
                        __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), d[r][0], x0);
                        dot = _mm512_dpbusd_epi32(dot, d[r][1], x1);
                        dot = _mm512_dpbusd_epi32(dot, d[r][2], x2);
                        dot = _mm512_dpbusd_epi32(dot, d[r][3], x3);
                        acc[r][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(s[r], sx), acc[r][m]);
                    }
                }
            }
            if (octets_end < count) {
                if (t == 2) tail_rows<R, M, 2>(acc, x, w, n, tail, sw, next, next_bytes);
                else tail_rows<R, M, 4>(acc, x, w, n, tail, sw, next, next_bytes);
            }
        }
        for (int r = 0; r < R; ++r)
            for (int m = 0; m < M; ++m) store(y + m * y_stride + n + r, _mm512_reduce_add_ps(acc[r][m]));
    }
    if (n < n1) rows_vnni<1, M, T>(y, y_stride, x, w, n, n1, n_end);
}

// y [M, N] (rows y_stride apart) = xf [M, Kp] (float32, zero past K) times w.
template <typename T>
void run(T* y, int64_t y_stride, const float* xf, int64_t M, const Weight& w, int64_t N) {
    thread_local QuantizedRows qx;
    quantize_rows(xf, M, w.Kp, qx);
    const QuantizedRows& x = qx;  // this thread's: a thread_local named in the workers would be theirs
    rill_simd::row_blocks(N, w.Kp / 2, M, [&](int64_t b0, int64_t b1, int64_t n_end, int64_t m, auto rows) {
        constexpr int rows_now = decltype(rows)::value;
        const int64_t groups = w.Kp / 32;
        const bool tail = !x.tail_q.empty();
        const RowsView part{x.q.data() + m * x.Ko, x.scale.data() + m * (x.Ko / 16), x.sum.data() + m * groups, x.Ko,
                            tail ? x.tail_q.data() + 256 * m : nullptr, tail ? x.tail_scale.data() + 16 * m : nullptr};
        rows_vnni<rows_now <= 2 ? 4 : 2, rows_now, T>(y + m * y_stride, y_stride, part, w, b0, b1, n_end);
    });
}

}  // namespace rill_int4::vnni
#endif
