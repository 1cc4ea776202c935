// Paged decode attention's bfloat16 path, for head sizes of 32, 64 or 128 and 1 to 8 query heads
// per KV head, on the helpers of paged_decode_kernels.h.
#include "paged_decode_kernels.h"

namespace rill_paged {

// The bfloat16 path for D = 32 * C2 and G query heads per KV head. 32 bfloat16 values load as 16
// 32-bit lanes; a lane's high half is an odd element, already a float when its low half is masked
// off, and its low half shifted up is the even element: two ALU ops, no shuffle, for 32 values.
// So queries and outputs are split into even and odd lanes, and put back together at the end.
// One pass over a tile's tokens serves all G query heads (G is a template argument, so the G
// accumulators of the V pass stay in registers).
inline v16f bf16_even(v16u x) { return reinterpret_cast<v16f>(x << 16); }
inline v16f bf16_odd(v16u x) { return reinterpret_cast<v16f>(x & 0xffff0000u); }
inline v16u load16u(const uint16_t* p) {
    v16u x;
    std::memcpy(&x, p, sizeof x);
    return x;
}

struct Bf16Scratch {
    std::vector<v16f> q;  // [nq][2 * C2]: even and odd halves of each 32-value chunk
    std::vector<v16f> acc;  // [nh][G][2 * C2]: the output accumulators, the same halves
    std::vector<float> scores;
};

template <int C2, int G>
void attend_bf16(uint16_t* out, const uint16_t* q, int64_t q_head, const uint16_t* k_cache, const uint16_t* v_cache,
                 const int64_t* table, int64_t len, int64_t h0, int64_t h1, int64_t num_kv_heads, int64_t block_size,
                 float scale, const ScoreMods& mods, Bf16Scratch& w) {
    constexpr int64_t D = 32 * C2;
    const int64_t nh = h1 - h0, nq = nh * G, row = len + 16;
    w.q.resize(nq * 2 * C2);
    w.scores.resize(nq * row);
    v16f* qv = w.q.data();
    float* s = w.scores.data();
    for (int64_t j = 0; j < nq; ++j)
        for (int c = 0; c < C2; ++c) {
            const v16u x = load16u(q + j * q_head + 32 * c);
            qv[(j * C2 + c) * 2] = bf16_even(x) * scale;
            qv[(j * C2 + c) * 2 + 1] = bf16_odd(x) * scale;
        }
    const int64_t token_stride = num_kv_heads * D;
    const int64_t num_blocks = (len + block_size - 1) / block_size;
    auto prefetch = [&](int64_t blk) {
        if (blk >= num_blocks) return;
        const int64_t offset = (table[blk] * block_size * num_kv_heads + h0) * D;
        const char* k = reinterpret_cast<const char*>(k_cache + offset);
        const char* v = reinterpret_cast<const char*>(v_cache + offset);
        const int64_t bytes = nh * D * 2, stride = token_stride * 2;
        for (int64_t i = 0; i < block_size; ++i)
            for (int64_t b = 0; b < bytes; b += 64) {
                __builtin_prefetch(k + i * stride + b, 0, 3);
                touch(v + i * stride + b);
            }
    };
    prefetch(0);
    prefetch(1);
    v16f part[G][16];
    for (int64_t blk = 0, b0 = 0; blk < num_blocks; ++blk, b0 += block_size) {
        prefetch(blk + 2);
        const uint16_t* kb = k_cache + (table[blk] * block_size * num_kv_heads + h0) * D;
        const int64_t block_len = len - b0 < block_size ? len - b0 : block_size;
        for (int64_t i0 = 0; i0 < block_len; i0 += 16) {
            const int64_t n = block_len - i0 < 16 ? block_len - i0 : 16;
            for (int64_t h = 0; h < nh; ++h) {
                const v16f* qh = qv + h * G * 2 * C2;
                for (int64_t i = 0; i < 16; ++i) {
                    if (i >= n) {
                        for (int g = 0; g < G; ++g) part[g][i] = v16f{};
                        continue;
                    }
                    const uint16_t* kr = kb + (i0 + i) * token_stride + h * D;
                    v16f ke[C2], ko[C2];
                    for (int c = 0; c < C2; ++c) {
                        const v16u x = load16u(kr + 32 * c);
                        ke[c] = bf16_even(x);
                        ko[c] = bf16_odd(x);
                    }
                    for (int g = 0; g < G; ++g) {
                        const v16f* qg = qh + g * 2 * C2;
                        v16f a = qg[0] * ke[0] + qg[1] * ko[0];
                        for (int c = 1; c < C2; ++c) a += qg[2 * c] * ke[c] + qg[2 * c + 1] * ko[c];
                        part[g][i] = a;
                    }
                }
                for (int g = 0; g < G; ++g) {
                    const v16f scores = hsum16(part[g]);
                    std::memcpy(s + (h * G + g) * row + b0 + i0, &scores, sizeof scores);
                }
            }
        }
    }
    float inv_sum[64 * G];
    std::vector<float> inv_sum_heap(nq > 64 * G ? nq : 0);
    float* inv = nq > 64 * G ? inv_sum_heap.data() : inv_sum;
    softmax_rows(s, nq, len, row, inv, mods);
    // Tiles outer, heads inner, as in the K pass: a tile's 16 tokens x all heads are one
    // contiguous run, read from memory once (a head-outer loop read every block once per head,
    // and cost twice the K pass). Each head's G accumulators live in registers for a tile.
    w.acc.assign(nh * G * 2 * C2, v16f{});
    v16f* accs = w.acc.data();
    for (int64_t blk = 0, b0 = 0; blk < num_blocks; ++blk, b0 += block_size) {
        const uint16_t* vb = v_cache + (table[blk] * block_size * num_kv_heads + h0) * D;
        const int64_t block_len = len - b0 < block_size ? len - b0 : block_size;
        for (int64_t i0 = 0; i0 < block_len; i0 += 16) {
            const int64_t n = block_len - i0 < 16 ? block_len - i0 : 16;
            for (int64_t h = 0; h < nh; ++h) {
                v16f acc[G][2 * C2];
                std::memcpy(acc, accs + h * G * 2 * C2, sizeof acc);
                const float* sh = s + h * G * row + b0 + i0;
                for (int64_t i = 0; i < n; ++i) {
                    const uint16_t* vr = vb + (i0 + i) * token_stride + h * D;
                    v16f ve[C2], vo[C2];
                    for (int c = 0; c < C2; ++c) {
                        const v16u x = load16u(vr + 32 * c);
                        ve[c] = bf16_even(x);
                        vo[c] = bf16_odd(x);
                    }
                    for (int g = 0; g < G; ++g) {
                        const float p = sh[g * row + i];
                        for (int c = 0; c < C2; ++c) {
                            acc[g][2 * c] += p * ve[c];
                            acc[g][2 * c + 1] += p * vo[c];
                        }
                    }
                }
                std::memcpy(accs + h * G * 2 * C2, acc, sizeof acc);
            }
        }
    }
    for (int64_t h = 0; h < nh; ++h)
        for (int g = 0; g < G; ++g) {
            const int64_t j = h * G + g;
            const v16f* a = accs + (h * G + g) * 2 * C2;
            for (int c = 0; c < C2; ++c) {
                const v16f e = a[2 * c] * inv[j], o = a[2 * c + 1] * inv[j];
                for (int l = 0; l < 16; ++l) {
                    store(out + j * D + 32 * c + 2 * l, e[l]);
                    store(out + j * D + 32 * c + 2 * l + 1, o[l]);
                }
            }
        }
}

template <int C2, int G>
void attend_all_bf16(uint16_t* out, const uint16_t* q, int64_t q_tok, int64_t q_head, const uint16_t* k_cache,
                     const uint16_t* v_cache, const int64_t* table, int64_t table_stride, const int64_t* lens,
                     int64_t B, int64_t Hq, int64_t Hkv, int64_t heads_per_item, int64_t block_size, float scale,
                     const Masking& masking) {
    constexpr int64_t D = 32 * C2;
    const int64_t items_per_seq = Hkv / heads_per_item, num_items = B * items_per_seq;
#pragma omp parallel
    {
        Bf16Scratch w;
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < num_items; ++item) {
            const int64_t b = item / items_per_seq, h0 = (item % items_per_seq) * heads_per_item;
            const RowSpan r = row_span(table + b * table_stride, lens[b], masking.window, block_size);
            attend_bf16<C2, G>(out + (b * Hq + h0 * G) * D, q + b * q_tok + h0 * G * q_head, q_head, k_cache,
                               v_cache, r.table, r.len, h0, h0 + heads_per_item, Hkv, block_size, scale,
                               score_mods(r, masking, h0 * G), w);
        }
    }
}

// The bfloat16 path's instances: head sizes 32, 64 and 128, groups of 1 to 8 query heads.
// Returns false for any other shape (the generic paths take it).
template <int C2>
bool dispatch_bf16_group(int64_t group, uint16_t* out, const uint16_t* q, int64_t q_tok, int64_t q_head,
                         const uint16_t* k_cache, const uint16_t* v_cache, const int64_t* table, int64_t table_stride,
                         const int64_t* lens, int64_t B, int64_t Hq, int64_t Hkv, int64_t heads_per_item,
                         int64_t block_size, float scale, const Masking& masking) {
#define RILL_GROUP(g)                                                                                             \
    case g:                                                                                                       \
        attend_all_bf16<C2, g>(out, q, q_tok, q_head, k_cache, v_cache, table, table_stride, lens, B, Hq, Hkv,    \
                               heads_per_item, block_size, scale, masking);                                       \
        return true;
    switch (group) {
        RILL_GROUP(1) RILL_GROUP(2) RILL_GROUP(3) RILL_GROUP(4) RILL_GROUP(5) RILL_GROUP(6) RILL_GROUP(7)
        RILL_GROUP(8)
        default:
            return false;
    }
#undef RILL_GROUP
}

bool dispatch_bf16(int64_t D, int64_t group, uint16_t* out, const uint16_t* q, int64_t q_tok, int64_t q_head,
                   const uint16_t* k_cache, const uint16_t* v_cache, const int64_t* table, int64_t table_stride,
                   const int64_t* lens, int64_t B, int64_t Hq, int64_t Hkv, int64_t heads_per_item,
                   int64_t block_size, float scale, const Masking& masking) {
    if ((q_head & 1) || (q_tok & 1)) return false;  // the query's 32-bit lanes must be aligned pairs
    switch (D) {
        case 32:
            return dispatch_bf16_group<1>(group, out, q, q_tok, q_head, k_cache, v_cache, table, table_stride, lens,
                                          B, Hq, Hkv, heads_per_item, block_size, scale, masking);
        case 64:
            return dispatch_bf16_group<2>(group, out, q, q_tok, q_head, k_cache, v_cache, table, table_stride, lens,
                                          B, Hq, Hkv, heads_per_item, block_size, scale, masking);
        case 128:
            return dispatch_bf16_group<4>(group, out, q, q_tok, q_head, k_cache, v_cache, table, table_stride, lens,
                                          B, Hq, Hkv, heads_per_item, block_size, scale, masking);
        default:
            return false;
    }
}

}  // namespace rill_paged
