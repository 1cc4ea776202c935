// The paged decode kernel's helpers and paths shared by its translation units: paged_decode.cpp
// (the row-at-a-time path, the dispatch, the operators), paged_decode_tiled.cpp (float32, heads of
// 32, 64 or 128) and paged_decode_bf16.cpp (bfloat16, 1 to 8 query heads per KV head).
//
// Layouts (the last dimension contiguous everywhere):
//   q      [B, Hq, D]     strides q_tok, q_head
//   k_cache [num_blocks, block_size, Hkv, D] contiguous; v the same
//   block_table [B, table_width] int64, row stride table_stride
//   context_lens [B] int64: keys 0..len-1 of row b (its new token included)
//   out    [B, Hq, D] contiguous
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "float_bits.h"

namespace rill_paged {

using rill_float::exp_clamped;
using rill_float::store;
using rill_float::to_float;
using rill_float::v16f;

// What a layer's scores get beyond a plain softmax (the transformers route's Gemma 2, Mistral,
// GPT-OSS layers): a sliding window (only the last `window` keys are attended; 0: all), logit
// soft-capping (each score becomes softcap * tanh(score / softcap); 0: none) and attention sinks
// (a logit per query head, [Hq] floats, that joins the softmax's denominator; null: none).
struct Masking {
    int64_t window = 0;
    float softcap = 0.0f;
    const float* sinks = nullptr;
};

// One row's keys under a window: its blocks from the first that holds a key inside the window, its
// length counted from there, and how many keys at the start of that block fall before the window.
// The blocks before it are not read (the scheduler may have released them).
struct RowSpan {
    const int64_t* table;
    int64_t len;
    int64_t skip;
};
inline RowSpan row_span(const int64_t* table, int64_t len, int64_t window, int64_t block_size) {
    if (window <= 0 || len <= window) return {table, len, 0};
    const int64_t first = len - window, blocks = first / block_size;
    return {table + blocks, len - blocks * block_size, first - blocks * block_size};
}

// A work item's view of Masking: the keys its row skips, the soft-cap, and its query heads' sinks.
struct ScoreMods {
    int64_t skip = 0;
    float softcap = 0.0f;
    const float* sinks = nullptr;
};
inline ScoreMods score_mods(const RowSpan& row, const Masking& masking, int64_t first_query_head) {
    return {row.skip, masking.softcap, masking.sinks != nullptr ? masking.sinks + first_query_head : nullptr};
}

// Softmax of `rows` score rows (the first `len` of every `stride`), each left unnormalised:
// e^(s - max) in place, and 1 / sum in inv_sum, applied to the output at the end. With `mods`:
// the first `skip` scores of a row become 0, the rest are soft-capped first, and row j's sink
// joins the max and the sum.
inline void softmax_rows(float* s, int64_t rows, int64_t len, int64_t stride, float* inv_sum,
                         const ScoreMods& mods = {}) {
    const int64_t skip = mods.skip;
    for (int64_t j = 0; j < rows; ++j) {
        float* sj = s + j * stride;
        if (mods.softcap > 0.0f) {
            const float cap = mods.softcap, inv_cap = 1.0f / mods.softcap;
            for (int64_t t = skip; t < len; ++t) sj[t] = cap * std::tanh(sj[t] * inv_cap);
        }
        float m = mods.sinks != nullptr && mods.sinks[j] > sj[skip] ? mods.sinks[j] : sj[skip];
#pragma omp simd reduction(max : m)
        for (int64_t t = skip + 1; t < len; ++t) m = sj[t] > m ? sj[t] : m;
        float sum = mods.sinks != nullptr ? exp_clamped(mods.sinks[j] - m) : 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t t = skip; t < len; ++t) {
            float e = exp_clamped(sj[t] - m);
            sj[t] = e;
            sum += e;
        }
        for (int64_t t = 0; t < skip; ++t) sj[t] = 0.0f;
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


// The tiled path (paged_decode_tiled.cpp) for T float or uint16_t (bfloat16 bits): false for a head
// size other than 32, 64 or 128 (the row-at-a-time path takes it).
template <typename T>
bool attend_tiled_all(int64_t D, T* out, const T* q, int64_t q_tok, int64_t q_head, const T* k_cache,
                      const T* v_cache, const int64_t* table, int64_t table_stride, const int64_t* lens, int64_t B,
                      int64_t Hq, int64_t Hkv, int64_t group, int64_t heads_per_item, int64_t block_size, float scale,
                      const Masking& masking);

// The bfloat16 path (paged_decode_bf16.cpp): false for a shape it has no instance for.
bool dispatch_bf16(int64_t D, int64_t group, uint16_t* out, const uint16_t* q, int64_t q_tok, int64_t q_head,
                   const uint16_t* k_cache, const uint16_t* v_cache, const int64_t* table, int64_t table_stride,
                   const int64_t* lens, int64_t B, int64_t Hq, int64_t Hkv, int64_t heads_per_item,
                   int64_t block_size, float scale, const Masking& masking);

}  // namespace rill_paged
