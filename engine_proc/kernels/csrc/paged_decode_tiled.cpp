// Paged decode attention's tiled path for float32 (and bfloat16 groups the bfloat16 path has no
// instance for), for head sizes of 32, 64 or 128, on the helpers of paged_decode_kernels.h.
#include "paged_decode_kernels.h"

namespace rill_paged {

template <typename T, int C>
void attend_tiled(T* out, const T* q, int64_t q_head, const T* k_cache, const T* v_cache, const int64_t* table,
                  int64_t len, int64_t h0, int64_t h1, int64_t num_kv_heads, int64_t group, int64_t block_size,
                  float scale, const ScoreMods& mods, TiledScratch& w) {
    constexpr int64_t D = 16 * C;
    const int64_t nh = h1 - h0, nq = nh * group, row = len + 16;  // a score row has room for a whole last tile
    w.q.resize(nq * C);
    w.acc.assign(nq * C, v16f{});
    w.scores.resize(nq * row);
    v16f* qv = w.q.data();
    v16f* acc = w.acc.data();
    float* s = w.scores.data();
    for (int64_t j = 0; j < nq; ++j)
        for (int c = 0; c < C; ++c) qv[j * C + c] = load16(q + j * q_head + 16 * c) * scale;
    const int64_t token_stride = num_kv_heads * D;
    const int64_t num_blocks = (len + block_size - 1) / block_size;
    // Two blocks ahead in the K pass, and the same blocks' V read into cache for the V pass after
    // it: a block's rows are a few KB, too little for the hardware prefetcher to get ahead alone.
    auto prefetch = [&](int64_t blk) {
        if (blk >= num_blocks) return;
        const int64_t offset = (table[blk] * block_size * num_kv_heads + h0) * D;
        const char* k = reinterpret_cast<const char*>(k_cache + offset);
        const char* v = reinterpret_cast<const char*>(v_cache + offset);
        const int64_t bytes = nh * D * static_cast<int64_t>(sizeof(T)), stride = token_stride * sizeof(T);
        for (int64_t i = 0; i < block_size; ++i)
            for (int64_t b = 0; b < bytes; b += 64) {
                __builtin_prefetch(k + i * stride + b, 0, 3);
                touch(v + i * stride + b);
            }
    };
    prefetch(0);
    prefetch(1);
    v16f tile[16][C];
    for (int64_t blk = 0, b0 = 0; blk < num_blocks; ++blk, b0 += block_size) {
        prefetch(blk + 2);
        const T* kb = k_cache + (table[blk] * block_size * num_kv_heads + h0) * D;
        const int64_t block_len = len - b0 < block_size ? len - b0 : block_size;
        for (int64_t i0 = 0; i0 < block_len; i0 += 16) {
            const int64_t n = block_len - i0 < 16 ? block_len - i0 : 16;
            for (int64_t h = 0; h < nh; ++h) {
                for (int64_t i = 0; i < 16; ++i)
                    for (int c = 0; c < C; ++c)
                        tile[i][c] = i < n ? load16(kb + (i0 + i) * token_stride + h * D + 16 * c) : v16f{};
                for (int64_t g = 0; g < group; ++g) {
                    const int64_t j = h * group + g;
                    v16f part[16];
                    for (int64_t i = 0; i < 16; ++i) {
                        v16f a = qv[j * C] * tile[i][0];
                        for (int c = 1; c < C; ++c) a += qv[j * C + c] * tile[i][c];
                        part[i] = a;
                    }
                    const v16f scores = hsum16(part);
                    std::memcpy(s + j * row + b0 + i0, &scores, sizeof scores);
                }
            }
        }
    }
    std::vector<float> inv_sum(nq);
    softmax_rows(s, nq, len, row, inv_sum.data(), mods);
    for (int64_t blk = 0, b0 = 0; blk < num_blocks; ++blk, b0 += block_size) {
        const T* vb = v_cache + (table[blk] * block_size * num_kv_heads + h0) * D;
        const int64_t block_len = len - b0 < block_size ? len - b0 : block_size;
        for (int64_t i0 = 0; i0 < block_len; i0 += 16) {
            const int64_t n = block_len - i0 < 16 ? block_len - i0 : 16;
            for (int64_t h = 0; h < nh; ++h) {
                for (int64_t i = 0; i < n; ++i)
                    for (int c = 0; c < C; ++c) tile[i][c] = load16(vb + (i0 + i) * token_stride + h * D + 16 * c);
                for (int64_t g = 0; g < group; ++g) {
                    const int64_t j = h * group + g;
                    const float* p = s + j * row + b0 + i0;
                    v16f a[C];
                    for (int c = 0; c < C; ++c) a[c] = acc[j * C + c];
                    for (int64_t i = 0; i < n; ++i)
                        for (int c = 0; c < C; ++c) a[c] += p[i] * tile[i][c];
                    for (int c = 0; c < C; ++c) acc[j * C + c] = a[c];
                }
            }
        }
    }
    for (int64_t j = 0; j < nq; ++j)
        for (int c = 0; c < C; ++c) {
            const v16f o = acc[j * C + c] * inv_sum[j];
            for (int l = 0; l < 16; ++l) store(out + j * D + 16 * c + l, o[l]);
        }
}

// The float32 (and other-group bfloat16) tiled path.
template <typename T, int C>
void attend_all(T* out, const T* q, int64_t q_tok, int64_t q_head, const T* k_cache, const T* v_cache,
                const int64_t* table, int64_t table_stride, const int64_t* lens, int64_t B, int64_t Hq,
                int64_t Hkv, int64_t group, int64_t heads_per_item, int64_t block_size, float scale,
                const Masking& masking) {
    const int64_t D = 16 * C, items_per_seq = Hkv / heads_per_item, num_items = B * items_per_seq;
#pragma omp parallel
    {
        TiledScratch w;
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < num_items; ++item) {
            const int64_t b = item / items_per_seq, h0 = (item % items_per_seq) * heads_per_item;
            const RowSpan r = row_span(table + b * table_stride, lens[b], masking.window, block_size);
            attend_tiled<T, C>(out + (b * Hq + h0 * group) * D, q + b * q_tok + h0 * group * q_head, q_head,
                               k_cache, v_cache, r.table, r.len, h0, h0 + heads_per_item, Hkv, group, block_size,
                               scale, score_mods(r, masking, h0 * group), w);
        }
    }
}

template <typename T>
bool attend_tiled_all(int64_t D, T* out, const T* q, int64_t q_tok, int64_t q_head, const T* k_cache,
                      const T* v_cache, const int64_t* table, int64_t table_stride, const int64_t* lens, int64_t B,
                      int64_t Hq, int64_t Hkv, int64_t group, int64_t heads_per_item, int64_t block_size, float scale,
                      const Masking& masking) {
    switch (D) {
        case 32:
            return attend_all<T, 2>(out, q, q_tok, q_head, k_cache, v_cache, table, table_stride, lens, B, Hq, Hkv,
                                    group, heads_per_item, block_size, scale, masking), true;
        case 64:
            return attend_all<T, 4>(out, q, q_tok, q_head, k_cache, v_cache, table, table_stride, lens, B, Hq, Hkv,
                                    group, heads_per_item, block_size, scale, masking), true;
        case 128:
            return attend_all<T, 8>(out, q, q_tok, q_head, k_cache, v_cache, table, table_stride, lens, B, Hq, Hkv,
                                    group, heads_per_item, block_size, scale, masking), true;
        default:
            return false;
    }
}

template bool attend_tiled_all<float>(int64_t, float*, const float*, int64_t, int64_t, const float*, const float*,
                                      const int64_t*, int64_t, const int64_t*, int64_t, int64_t, int64_t, int64_t,
                                      int64_t, int64_t, float, const Masking&);
template bool attend_tiled_all<uint16_t>(int64_t, uint16_t*, const uint16_t*, int64_t, int64_t, const uint16_t*,
                                         const uint16_t*, const int64_t*, int64_t, const int64_t*, int64_t, int64_t,
                                         int64_t, int64_t, int64_t, int64_t, float, const Masking&);

}  // namespace rill_paged
