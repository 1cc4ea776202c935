// Causal attention of a prompt chunk over its keys, in bfloat16 on CPUs with AMX tiles or AVX-512
// BF16: the matmuls through ATen's brgemm (oneDNN's micro-kernels, float32 accumulation), the softmax
// here. torch's flash attention took about 1 ms a layer for a 512-token prompt of the bundled
// model (a quarter of its prefill); its causal case cost as much as the full one.
//
// Work is one task per (KV head, block of 32 query tokens): the block's query heads that share the
// KV head are the rows of one matmul against the keys the block may see (never the ones past its
// last token), so K and V are read once per block, not once per query head. The score rows are
// complete (no online softmax): a chunk's keys fit the per-thread buffers many times over.
// Shapes are padded to 64 keys and 64 query tokens so the set of micro-kernels oneDNN generates
// stays small whatever the prompt lengths.
//
// The operator rill_cpu::prefill_attention (bindings.cpp registers it); callers check
// prefill_attention_supported().
#include "prefill_attention.h"

#include <ATen/native/CPUBlas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "aligned.h"
#include "amx_linear.h"
#include "bf16_simd.h"
#include "float_bits.h"
#ifdef _OPENMP
#include <omp.h>
#endif

namespace rill_prefill {
namespace {

using rill_float::exp_clamped;
using rill_float::store;
using rill_float::to_float;

constexpr int64_t kBlock = 64;  // the padding of key counts, and the packed panels' width
// Query tokens per task. Measured on a 2-core Sapphire Rapids, 9 query and 3 KV heads of 64: a
// 512-token prompt took 0.68 ms a layer with 16, 32 or 64 (torch's flash attention 0.82); 512
// tokens after 488 cached ones 1.6 ms with 32 or 64, 2.2 with 16 (torch 2.2-2.3).
constexpr int64_t kQBlock = 32;

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

#ifdef RILL_BF16_SIMD
// dst[i * ld + j] = src[j * ls + i] for i, j < 16: a 16 x 16 block of 32-bit words transposed.
inline void transpose16(const uint32_t* src, int64_t ls, uint32_t* dst, int64_t ld) {
    __m512i r[16], t[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(src + i * ls);
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {
        r[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int i = 0; i < 2; ++i)
        for (int k = 0; k < 4; ++k) {
            t[8 * i + k] = _mm512_shuffle_i32x4(r[8 * i + k], r[8 * i + 4 + k], 0x88);
            t[8 * i + 4 + k] = _mm512_shuffle_i32x4(r[8 * i + k], r[8 * i + 4 + k], 0xdd);
        }
    for (int k = 0; k < 8; ++k) {
        r[k] = _mm512_shuffle_i32x4(t[k], t[8 + k], 0x88);
        r[8 + k] = _mm512_shuffle_i32x4(t[k], t[8 + k], 0xdd);
    }
    for (int i = 0; i < 16; ++i) _mm512_storeu_si512(dst + i * ld, r[i]);
}

// dst[2n] = v0[n], dst[2n + 1] = v1[n] for n < 64: two rows of V interleaved, as brgemm reads B.
inline void interleave64(const uint16_t* v0, const uint16_t* v1, uint16_t* dst) {
    alignas(64) static const uint16_t lo_idx[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                                    8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    const __m512i lo = _mm512_load_si512(lo_idx), hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    for (int h = 0; h < 2; ++h) {
        const __m512i a = _mm512_loadu_si512(v0 + 32 * h), b = _mm512_loadu_si512(v1 + 32 * h);
        _mm512_storeu_si512(dst + 64 * h, _mm512_permutex2var_epi16(a, lo, b));
        _mm512_storeu_si512(dst + 64 * h + 32, _mm512_permutex2var_epi16(a, hi, b));
    }
}
#endif

using rill_mem::buffer;

// Row r of the probabilities: p[j] = e^((s[j] - max) * scale) as bfloat16 for the first `limit`
// keys, zeros up to n_keys; returns 1 / their sum (0 for a padding row).
#ifdef RILL_BF16_SIMD
// Every CPU this kernel runs on has these (AMX or AVX-512 BF16). Written out, as GCC's vectorisation of the loops below took
// about half of a 512-token prompt's attention time (the rounding to bfloat16 by integer
// arithmetic, the three passes): here one pass finds the maximum, one makes, sums and stores.
inline float softmax_row(const float* s, uint16_t* p, int64_t limit, int64_t n_keys, float scale) {
    std::memset(p + limit, 0, (n_keys - limit) * sizeof(uint16_t));
    if (!limit) return 0.0f;
    // Two independent chains in each pass: one max or add waits on the last (4 cycles), which
    // bounded the row at about 0.25 ns a key.
    const int64_t full = limit / 16 * 16, pairs = limit / 32 * 32;
    const __mmask16 tail = static_cast<__mmask16>((1u << (limit - full)) - 1);
    __m512 vmax0 = _mm512_set1_ps(-INFINITY), vmax1 = vmax0;
    for (int64_t j = 0; j < pairs; j += 32) {
        vmax0 = _mm512_max_ps(vmax0, _mm512_loadu_ps(s + j));
        vmax1 = _mm512_max_ps(vmax1, _mm512_loadu_ps(s + j + 16));
    }
    if (full > pairs) vmax0 = _mm512_max_ps(vmax0, _mm512_loadu_ps(s + pairs));
    if (tail) vmax1 = _mm512_mask_max_ps(vmax1, tail, vmax1, _mm512_maskz_loadu_ps(tail, s + full));
    const float log2_scale = scale * 1.44269504088896341f;
    const __m512 vscale = _mm512_set1_ps(log2_scale);
    const __m512 vshift = _mm512_set1_ps(_mm512_reduce_max_ps(_mm512_max_ps(vmax0, vmax1)) * log2_scale);
    auto exp_at = [&](int64_t j, __mmask16 m) {  // e^((s - max) * scale) of 16 keys, stored; masked lanes 0
        const __m512 e = _mm512_maskz_mov_ps(m, rill_simd::exp2_16(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(m, s + j), vscale, vshift)));
        _mm256_mask_storeu_epi16(p + j, m, rill_simd::to_bf16(e));
        return e;
    };
    __m512 vsum0 = _mm512_setzero_ps(), vsum1 = vsum0;
    for (int64_t j = 0; j < pairs; j += 32) {
        vsum0 = _mm512_add_ps(vsum0, exp_at(j, 0xffff));
        vsum1 = _mm512_add_ps(vsum1, exp_at(j + 16, 0xffff));
    }
    if (full > pairs) vsum0 = _mm512_add_ps(vsum0, exp_at(pairs, 0xffff));
    if (tail) vsum1 = _mm512_add_ps(vsum1, exp_at(full, tail));
    return 1.0f / _mm512_reduce_add_ps(_mm512_add_ps(vsum0, vsum1));
}
#else  // an AMX CPU running a build for an older one (tests/model/test_cpu_kernels_portable.py)
inline float softmax_row(const float* s, uint16_t* p, int64_t limit, int64_t n_keys, float scale) {
    float mx = limit ? s[0] : 0.0f;
    for (int64_t j = 1; j < limit; ++j) mx = s[j] > mx ? s[j] : mx;
    float sum = 0.0f;
    for (int64_t j = 0; j < limit; ++j) {
        const float e = exp_clamped(s[j] * scale - mx * scale);
        sum += e;
        store(p + j, e);
    }
    std::memset(p + limit, 0, (n_keys - limit) * sizeof(uint16_t));
    return limit ? 1.0f / sum : 0.0f;
}
#endif

// out [Tq, H, D] (contiguous) = softmax(q k^T * scale, causal) v, where query i is the key
// position offset + i (offset = Tk - Tq: the chunk's tokens are the last Tq keys).
// Rows (bfloat16 bits): q + t*q_tok + h*q_head, k + t*k_tok + g*k_head, v + t*v_tok + g*v_head.
void attention(uint16_t* out, const uint16_t* q, int64_t q_tok, int64_t q_head, const uint16_t* k, int64_t k_tok,
               int64_t k_head, const uint16_t* v, int64_t v_tok, int64_t v_head, int64_t Tq, int64_t Tk, int64_t H,
               int64_t KV, int64_t D, float scale) {
    using at::BFloat16;
    const int64_t G = H / KV, offset = Tk - Tq, Tk_pad = round_up(Tk, kBlock);
    const int64_t num_q_blocks = (Tq + kQBlock - 1) / kQBlock, M = G * kQBlock;
    // Packed as brgemm reads them (VNNI pairs), in 64-column panels (the widths oneDNN's pack
    // writes): K^T [D, 64] per 64 keys, and V [Tk_pad, 64] per 64 of the head dimension.
    const int64_t key_blocks = Tk_pad / kBlock, d_blocks = D / kBlock;
    // Buffers left uninitialised (every element is written before it is read): zeroing them was a
    // serial pass of about 400 KB a layer before the parallel part.
    const auto kt_packed = buffer<uint16_t>(KV * key_blocks * D * kBlock), v_packed = buffer<uint16_t>(KV * d_blocks * Tk_pad * kBlock);
    auto kt_panel = [&](int64_t g, int64_t b) { return kt_packed.get() + (g * key_blocks + b) * D * kBlock; };
    auto v_panel = [&](int64_t g, int64_t c) { return v_packed.get() + (g * d_blocks + c) * Tk_pad * kBlock; };
    // K's rows as whole 32-bit words (even strides, an aligned start): the vector transpose applies.
    const bool words = k_tok % 2 == 0 && k_head % 2 == 0 && reinterpret_cast<uintptr_t>(k) % 4 == 0;
#pragma omp parallel
    {
        // One task per (KV head, 64 keys): its K^T panel, and its 64 rows of each V panel (packed in
        // pairs of rows, so 64 rows are a slice of their own of the packed panel). Written straight
        // in brgemm's pair layout (what cpublas::pack writes: element (r, n) of a [R, 64] matrix at
        // (r / 2) * 128 + n * 2 + r % 2), which took half the time of a transpose and pack.
#pragma omp for schedule(static)
        for (int64_t task = 0; task < KV * key_blocks; ++task) {
            const int64_t g = task / key_blocks, b = task % key_blocks;
            // K^T [D, 64 keys]: the pair (K[j, 2i], K[j, 2i + 1]) is 32-bit word i * 64 + j.
            uint32_t* kt = reinterpret_cast<uint32_t*>(kt_panel(g, b));
            const bool whole = (b + 1) * kBlock <= Tk;  // no padding key in this block
#ifdef RILL_BF16_SIMD
            if (whole && words) {  // in 16 x 16 blocks of words, and V two rows at a time
                for (int64_t j0 = 0; j0 < kBlock; j0 += 16)
                    for (int64_t i0 = 0; i0 < D / 2; i0 += 16)
                        transpose16(reinterpret_cast<const uint32_t*>(k + (b * kBlock + j0) * k_tok + g * k_head) + i0,
                                    k_tok / 2, kt + i0 * kBlock + j0, kBlock);
                for (int64_t c = 0; c < d_blocks; ++c)
                    for (int64_t i = 0; i < kBlock / 2; ++i) {
                        const uint16_t* v0 = v + (b * kBlock + 2 * i) * v_tok + g * v_head + c * kBlock;
                        interleave64(v0, v0 + v_tok, v_panel(g, c) + b * kBlock * kBlock + i * 2 * kBlock);
                    }
                continue;
            }
#endif
            for (int64_t j = 0; j < kBlock; ++j) {
                const int64_t t = b * kBlock + j;
                const uint16_t* kr = k + t * k_tok + g * k_head;
                for (int64_t i = 0; i < D / 2; ++i) {
                    uint32_t w = 0;
                    if (t < Tk) std::memcpy(&w, kr + 2 * i, 4);
                    kt[i * kBlock + j] = w;
                }
            }
            // V [keys, 64 of D]: keys 2i and 2i + 1 interleaved, column by column.
            for (int64_t c = 0; c < d_blocks; ++c) {
                uint16_t* vp = v_panel(g, c) + b * kBlock * kBlock;
                for (int64_t i = 0; i < kBlock / 2; ++i) {
                    const int64_t t = b * kBlock + 2 * i;
                    const uint16_t* v0 = v + t * v_tok + g * v_head + c * kBlock;
                    const uint16_t* v1 = v0 + v_tok;
                    uint16_t* dst = vp + i * 2 * kBlock;
                    for (int64_t n = 0; n < kBlock; ++n) {
                        dst[2 * n] = t < Tk ? v0[n] : 0;
                        dst[2 * n + 1] = t + 1 < Tk ? v1[n] : 0;
                    }
                }
            }
        }
        const auto a = buffer<uint16_t>(M * D), p = buffer<uint16_t>(M * (Tk_pad + 32));
        const auto s = buffer<float>(M * (Tk_pad + 16)), o = buffer<float>(M * D), inv_sum = buffer<float>(M);
        // The costliest blocks (the last queries see the most keys) first, one at a time.
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < KV * num_q_blocks; ++task) {
            const int64_t qb = num_q_blocks - 1 - task / KV, g = task % KV;
            const int64_t t0 = qb * kQBlock, m = std::min(kQBlock, Tq - t0);
            const int64_t n_keys = round_up(std::min(Tk, offset + t0 + m), kBlock);
            // Row strides of the scores and probabilities 64 bytes past a multiple of the keys: at
            // 512 keys, score rows 2 KB apart (cache-set conflicts) made the Q K^T brgemm 1.4x slower.
            const int64_t ls = n_keys + 16, lp = n_keys + 32;
            // A [G * 64, D]: row hl * 64 + i is query token t0 + i of head g * G + hl (padding rows 0).
            for (int64_t hl = 0; hl < G; ++hl)
                for (int64_t i = 0; i < kQBlock; ++i) {
                    uint16_t* ar = a.get() + (hl * kQBlock + i) * D;
                    if (i < m)
                        std::memcpy(ar, q + (t0 + i) * q_tok + (g * G + hl) * q_head, D * sizeof(uint16_t));
                    else
                        std::memset(ar, 0, D * sizeof(uint16_t));
                }
            for (int64_t b = 0; b < n_keys / kBlock; ++b)
                at::native::cpublas::brgemm(M, kBlock, D, D, kBlock, ls, false,
                                            reinterpret_cast<const BFloat16*>(a.get()),
                                            reinterpret_cast<const BFloat16*>(kt_panel(g, b)), s.get() + b * kBlock);
            for (int64_t r = 0; r < M; ++r) {
                const int64_t i = r % kQBlock;
                const int64_t limit = i < m ? offset + t0 + i + 1 : 0;  // keys this query sees
                inv_sum[r] = softmax_row(s.get() + r * ls, p.get() + r * lp, limit, n_keys, scale);
            }
            for (int64_t c = 0; c < d_blocks; ++c)
                at::native::cpublas::brgemm(M, kBlock, n_keys, lp, kBlock, D, false,
                                            reinterpret_cast<const BFloat16*>(p.get()),
                                            reinterpret_cast<const BFloat16*>(v_panel(g, c)), o.get() + c * kBlock);
            for (int64_t hl = 0; hl < G; ++hl)
                for (int64_t i = 0; i < m; ++i) {
                    const int64_t r = hl * kQBlock + i;
                    const float* orow = o.get() + r * D;
                    uint16_t* dst = out + ((t0 + i) * H + g * G + hl) * D;
#ifdef RILL_BF16_SIMD
                    const __m512 scale_r = _mm512_set1_ps(inv_sum[r]);
                    for (int64_t d = 0; d < D; d += 16)
                        rill_simd::store_bf16(dst + d, _mm512_mul_ps(_mm512_loadu_ps(orow + d), scale_r));
#else
#pragma omp simd
                    for (int64_t d = 0; d < D; ++d) store(dst + d, orow[d] * inv_sum[r]);
#endif
                }
        }
        at::native::cpublas::brgemm_release();
    }
}

}  // namespace
}  // namespace rill_prefill

namespace rill_cpu {

// Where amx_linear.cpp's brgemm runs: AMX-BF16, or AVX-512 BF16. Measured on a 2-core Zen 4, a
// 512-token prompt of the bundled model: 1.0 against 5.3 ms a layer for torch's flash attention.
bool prefill_attention_supported() { return amx_linear_supported(); }

at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    TORCH_CHECK(prefill_attention_supported(), "prefill_attention: this CPU has neither AMX-BF16 nor AVX-512 BF16 (see prefill_attention_supported)");
    TORCH_CHECK(q.scalar_type() == at::kBFloat16 && k.scalar_type() == at::kBFloat16 && v.scalar_type() == at::kBFloat16,
                "prefill_attention: bfloat16 q, k and v");
    TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3 && q.stride(2) == 1 && k.stride(2) == 1 &&
                    v.stride(2) == 1 && k.sizes() == v.sizes(),
                "prefill_attention: q [Tq, H, D], k and v [Tk, H_kv, D], rows contiguous");
    const int64_t Tq = q.size(0), H = q.size(1), D = q.size(2), Tk = k.size(0), KV = k.size(1);
    TORCH_CHECK(k.size(2) == D && H % KV == 0 && Tk >= Tq && D % 64 == 0,
                "prefill_attention: query heads a multiple of the KV heads, at least as many keys as queries, a head "
                "dimension that is a multiple of 64");
    at::Tensor out = q.new_empty({Tq, H, D});
    rill_prefill::attention(reinterpret_cast<uint16_t*>(out.data_ptr()), reinterpret_cast<const uint16_t*>(q.data_ptr()),
                            q.stride(0), q.stride(1), reinterpret_cast<const uint16_t*>(k.data_ptr()), k.stride(0), k.stride(1),
                            reinterpret_cast<const uint16_t*>(v.data_ptr()), v.stride(0), v.stride(1), Tq, Tk, H, KV, D,
                            1.0f / std::sqrt(static_cast<float>(D)));
    return out;
}

}  // namespace rill_cpu
