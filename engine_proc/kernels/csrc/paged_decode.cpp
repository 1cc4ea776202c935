// Paged decode attention on the CPU: one query token per sequence against its K/V blocks,
// read where they lie in the cache (no gather into a contiguous copy, no mask).
//
// Plain C++ with a C entry point; ops.cpp wraps it as the torch operator rill_cpu::paged_decode,
// built at first use for the CPU it runs on (-march=native) by engine_proc/cpu_kernels.py.
// OpenMP: the library links libgomp.so.1, which resolves to the copy torch has loaded, so it
// shares torch's thread pool and thread count.
//
// Layouts (the last dimension contiguous everywhere):
//   q      [B, Hq, D]     strides q_tok, q_head
//   k_new  [B, Hkv, D]    strides kn_tok, kn_head (may be null: nothing to write)
//   k_cache [num_blocks, block_size, Hkv, D] contiguous; v the same
//   block_table [B, table_width] int64, row stride table_stride
//   context_lens [B] int64: keys 0..len-1 of row b (its new token included)
//   out    [B, Hq, D] contiguous
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "float_bits.h"
#ifdef _OPENMP
#include <omp.h>
#endif

namespace rill_paged {

using rill_float::exp_clamped;
using rill_float::store;
using rill_float::to_float;
using rill_float::v16f;

// Softmax of `rows` score rows (the first `len` of every `stride`), each left unnormalised:
// e^(s - max) in place, and 1 / sum in inv_sum, applied to the output at the end.
inline void softmax_rows(float* s, int64_t rows, int64_t len, int64_t stride, float* inv_sum) {
    for (int64_t j = 0; j < rows; ++j) {
        float* sj = s + j * stride;
        float m = sj[0];
#pragma omp simd reduction(max : m)
        for (int64_t t = 1; t < len; ++t) m = sj[t] > m ? sj[t] : m;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t t = 0; t < len; ++t) {
            float e = exp_clamped(sj[t] - m);
            sj[t] = e;
            sum += e;
        }
        inv_sum[j] = 1.0f / sum;
    }
}

// Reads one byte of a cache line so that the line comes in (into L1, then L2) while the K pass
// computes: measured, a software prefetch of the V blocks (prefetcht1) did not bring them, and the
// V pass then stalled on every line (a whole layer at batch 32: 430 us, against 290 us with these
// loads). Presumably the prefetches were dropped: they rarely share a page with what was just read.
inline void touch(const char* p) {
    char c = *reinterpret_cast<const volatile char*>(p);
    asm volatile("" : : "r"(c));
}

// Per-thread scratch: queries, scores and accumulators as floats.
struct Scratch {
    std::vector<float> q, scores, acc, row;
};

// Rows of K/V heads [h0, h1) of one sequence: with all heads, each block of the cache is read as
// one contiguous run (block_size x Hkv x D), which the hardware prefetcher streams well.
template <typename T>
void attend(T* out, const T* q, int64_t q_head, const T* k_cache, const T* v_cache, const int64_t* table,
            int64_t len, int64_t h0, int64_t h1, int64_t num_kv_heads, int64_t group, int64_t D,
            int64_t block_size, float scale, Scratch& w) {
    const int64_t nh = h1 - h0, nq = nh * group;  // query heads handled here
    w.q.resize(nq * D);
    w.acc.assign(nq * D, 0.0f);
    w.scores.resize(nq * len);
    w.row.resize(nh * D);
    float* qf = w.q.data();
    float* s = w.scores.data();
    float* kf = w.row.data();
    for (int64_t j = 0; j < nq; ++j)
        for (int64_t d = 0; d < D; ++d) qf[j * D + d] = to_float(q[j * q_head + d]) * scale;
    const int64_t token_stride = num_kv_heads * D;
    const int64_t run = nh * D * static_cast<int64_t>(sizeof(T));  // bytes of one token's heads
    const int64_t num_blocks = (len + block_size - 1) / block_size;
    auto prefetch = [&](const T* cache, int64_t blk) {
        if (blk >= num_blocks) return;
        const char* p = reinterpret_cast<const char*>(cache + (table[blk] * block_size * num_kv_heads + h0) * D);
        for (int64_t i = 0; i < block_size; ++i)
            for (int64_t b = 0; b < run; b += 64) __builtin_prefetch(p + i * token_stride * sizeof(T) + b);
    };
    // Scores: each key row is converted once and dotted with every query head of its group.
    for (int64_t blk = 0, t0 = 0; blk < num_blocks; ++blk, t0 += block_size) {
        prefetch(k_cache, blk + 1);
        const int64_t n = len - t0 < block_size ? len - t0 : block_size;
        const T* kb = k_cache + (table[blk] * block_size * num_kv_heads + h0) * D;
        for (int64_t i = 0; i < n; ++i) {
            const T* kr = kb + i * token_stride;
#pragma omp simd
            for (int64_t d = 0; d < nh * D; ++d) kf[d] = to_float(kr[d]);
            for (int64_t j = 0; j < nq; ++j) {
                const float* qj = qf + j * D;
                const float* kh = kf + (j / group) * D;
                float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                for (int64_t d = 0; d < D; ++d) dot += qj[d] * kh[d];
                s[j * len + t0 + i] = dot;
            }
        }
    }
    std::vector<float> inv_sum(nq);
    softmax_rows(s, nq, len, len, inv_sum.data());
    float* acc = w.acc.data();
    for (int64_t blk = 0, t0 = 0; blk < num_blocks; ++blk, t0 += block_size) {
        prefetch(v_cache, blk + 1);
        const int64_t n = len - t0 < block_size ? len - t0 : block_size;
        const T* vb = v_cache + (table[blk] * block_size * num_kv_heads + h0) * D;
        for (int64_t i = 0; i < n; ++i) {
            const T* vr = vb + i * token_stride;
#pragma omp simd
            for (int64_t d = 0; d < nh * D; ++d) kf[d] = to_float(vr[d]);
            for (int64_t j = 0; j < nq; ++j) {
                const float p = s[j * len + t0 + i];
                const float* vh = kf + (j / group) * D;
                float* aj = acc + j * D;
#pragma omp simd
                for (int64_t d = 0; d < D; ++d) aj[d] += p * vh[d];
            }
        }
    }
    for (int64_t j = 0; j < nq; ++j)
        for (int64_t d = 0; d < D; ++d) store(out + j * D + d, acc[j * D + d] * inv_sum[j]);
}

// The helpers of the tiled paths (paged_decode_tiled.cpp, paged_decode_bf16.cpp), for head sizes
// of 32, 64 or 128 (C = D / 16 vectors of 16 floats): K and V are read 16 tokens at a time. A tile's 16 scores of one query head come out of one
// transpose-and-add tree (hsum16) instead of 16 horizontal sums, and the output accumulators
// are vectors. GCC's vector extensions: zmm registers with AVX-512, pairs of ymm with AVX2.
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));

inline v16f load16(const float* p) {
    v16f x;
    std::memcpy(&x, p, sizeof x);
    return x;
}
inline v16f load16(const uint16_t* p) {
    v16h h;
    std::memcpy(&h, p, sizeof h);
    return reinterpret_cast<v16f>(__builtin_convertvector(h, v16u) << 16);
}

// Lane i of the result: the sum of the 16 lanes of v[i].
inline v16f hsum16(const v16f* v) {
    v16f u[8], w[4], x[2];
    for (int k = 0; k < 8; ++k)
        u[k] = __builtin_shufflevector(v[2 * k], v[2 * k + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               __builtin_shufflevector(v[2 * k], v[2 * k + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29,
                                       30, 31);
    for (int k = 0; k < 4; ++k)
        w[k] = __builtin_shufflevector(u[2 * k], u[2 * k + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
               __builtin_shufflevector(u[2 * k], u[2 * k + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30,
                                       31);
    for (int k = 0; k < 2; ++k)
        x[k] = __builtin_shufflevector(w[2 * k], w[2 * k + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
               __builtin_shufflevector(w[2 * k], w[2 * k + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30,
                                       31);
    return __builtin_shufflevector(x[0], x[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
           __builtin_shufflevector(x[0], x[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

struct TiledScratch {
    std::vector<v16f> q, acc;
    std::vector<float> scores;
};

}  // namespace rill_paged

// The tiled paths, on the helpers above: float32 (and any group size) and bfloat16.
#include "paged_decode_tiled.cpp"
#include "paged_decode_bf16.cpp"

namespace rill_paged {

// The step's new K/V rows (token t, head h at k + t*k_tok + h*k_head, D contiguous elements of
// `elem` bytes) into slot slots[t] of caches [slots, H_kv, D]. Tokens shared among the threads
// when there are enough of them (a prompt); the decode kernel's few rows stay on this thread.
inline void write_slots(char* k_cache, char* v_cache, const char* k, int64_t k_tok, int64_t k_head, const char* v,
                        int64_t v_tok, int64_t v_head, const int64_t* slots, int64_t T, int64_t Hkv, int64_t D,
                        int64_t elem) {
    const int64_t row = D * elem;
#pragma omp parallel for schedule(static) if (T > 16)
    for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < Hkv; ++h) {
            std::memcpy(k_cache + (slots[t] * Hkv + h) * row, k + (t * k_tok + h * k_head) * elem, row);
            std::memcpy(v_cache + (slots[t] * Hkv + h) * row, v + (t * v_tok + h * v_head) * elem, row);
        }
}

template <typename T>
int run(T* out, const T* q, int64_t q_tok, int64_t q_head, const T* k_new, int64_t kn_tok, int64_t kn_head,
        const T* v_new, int64_t vn_tok, int64_t vn_head, T* k_cache, T* v_cache, const int64_t* slots,
        const int64_t* table, int64_t table_stride, const int64_t* lens, int64_t B, int64_t Hq,
        int64_t Hkv, int64_t D, int64_t block_size, float scale) {
    if (Hkv <= 0 || Hq % Hkv != 0) return 1;
    const int64_t group = Hq / Hkv;
    if (k_new != nullptr)
        write_slots(reinterpret_cast<char*>(k_cache), reinterpret_cast<char*>(v_cache),
                    reinterpret_cast<const char*>(k_new), kn_tok, kn_head, reinterpret_cast<const char*>(v_new), vn_tok,
                    vn_head, slots, B, Hkv, D, sizeof(T));
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    // Enough sequences to share among the threads: one task per sequence, all its heads (whole
    // blocks read contiguously). Few sequences: one task per (sequence, KV head).
    const int64_t heads_per_item = B >= 2 * threads ? Hkv : 1;
    if constexpr (sizeof(T) == 2) {
        if (dispatch_bf16(D, group, out, q, q_tok, q_head, k_cache, v_cache, table, table_stride, lens, B, Hq, Hkv,
                          heads_per_item, block_size, scale))
            return 0;
    }
    switch (D) {
        case 32:
            return attend_all<T, 2>(out, q, q_tok, q_head, k_cache, v_cache, table, table_stride, lens, B, Hq, Hkv,
                                    group, heads_per_item, block_size, scale), 0;
        case 64:
            return attend_all<T, 4>(out, q, q_tok, q_head, k_cache, v_cache, table, table_stride, lens, B, Hq, Hkv,
                                    group, heads_per_item, block_size, scale), 0;
        case 128:
            return attend_all<T, 8>(out, q, q_tok, q_head, k_cache, v_cache, table, table_stride, lens, B, Hq, Hkv,
                                    group, heads_per_item, block_size, scale), 0;
        default:  // any other head size: the row-at-a-time path below
            break;
    }
    const int64_t items_per_seq = Hkv / heads_per_item;
    const int64_t num_items = B * items_per_seq;
#pragma omp parallel
    {
        Scratch w;
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < num_items; ++item) {
            const int64_t b = item / items_per_seq, h0 = (item % items_per_seq) * heads_per_item;
            attend<T>(out + (b * Hq + h0 * group) * D, q + b * q_tok + h0 * group * q_head, q_head, k_cache,
                      v_cache, table + b * table_stride, lens[b], h0, h0 + heads_per_item, Hkv, group, D,
                      block_size, scale, w);
        }
    }
    return 0;
}

}  // namespace rill_paged

extern "C" {

// dtype: 0 float32, 1 bfloat16. Returns 0, or 1 for a shape it does not handle.
int rill_paged_decode(int dtype, void* out, const void* q, int64_t q_tok, int64_t q_head, const void* k_new,
                      int64_t kn_tok, int64_t kn_head, const void* v_new, int64_t vn_tok, int64_t vn_head,
                      void* k_cache, void* v_cache, const int64_t* slots, const int64_t* table,
                      int64_t table_stride, const int64_t* lens, int64_t B, int64_t Hq, int64_t Hkv, int64_t D,
                      int64_t block_size, float scale) {
    if (dtype == 0)
        return rill_paged::run<float>(static_cast<float*>(out), static_cast<const float*>(q), q_tok, q_head,
                          static_cast<const float*>(k_new), kn_tok, kn_head, static_cast<const float*>(v_new), vn_tok,
                          vn_head, static_cast<float*>(k_cache), static_cast<float*>(v_cache), slots, table,
                          table_stride, lens, B, Hq, Hkv, D, block_size, scale);
    if (dtype == 1)
        return rill_paged::run<uint16_t>(static_cast<uint16_t*>(out), static_cast<const uint16_t*>(q), q_tok, q_head,
                             static_cast<const uint16_t*>(k_new), kn_tok, kn_head,
                             static_cast<const uint16_t*>(v_new), vn_tok, vn_head, static_cast<uint16_t*>(k_cache),
                             static_cast<uint16_t*>(v_cache), slots, table, table_stride, lens, B, Hq, Hkv, D,
                             block_size, scale);
    return 1;
}

}
