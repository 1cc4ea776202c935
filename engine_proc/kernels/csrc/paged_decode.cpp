// Paged decode attention on the CPU: one query token per sequence against its K/V blocks,
// read where they lie in the cache (no gather into a contiguous copy, no mask); the KV writes; the
// operators rill_cpu::paged_decode, write_kv, set_kv_caches and paged_decode_layer (bindings.cpp
// registers them). The tiled paths are paged_decode_tiled.cpp and paged_decode_bf16.cpp.
//
// OpenMP: the library links libgomp.so.1, which resolves to the copy torch has loaded, so it
// shares torch's thread pool and thread count.
#include "paged_decode.h"

#include <cmath>
#include <type_traits>
#include <utility>

#include "kv_int8.h"
#include "paged_decode_kernels.h"
#ifdef _OPENMP
#include <omp.h>
#endif

namespace rill_paged {
namespace {

// Per-thread scratch: queries, scores and accumulators as floats.
struct Scratch {
    std::vector<float> q, scores, acc, row;
};

// Rows of K/V heads [h0, h1) of one sequence: with all heads, each block of the cache is read as
// one contiguous run (block_size x Hkv x D), which the hardware prefetcher streams well.
template <typename T>
void attend(T* out, const T* q, int64_t q_head, const T* k_cache, const T* v_cache, const int64_t* table,
            int64_t len, int64_t h0, int64_t h1, int64_t num_kv_heads, int64_t group, int64_t D,
            int64_t block_size, float scale, const ScoreMods& mods, Scratch& w) {
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
    softmax_rows(s, nq, len, len, inv_sum.data(), mods);
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

}  // namespace

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
        int64_t Hkv, int64_t D, int64_t block_size, float scale, const Masking& masking) {
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
                          heads_per_item, block_size, scale, masking))
            return 0;
    }
    if (attend_tiled_all<T>(D, out, q, q_tok, q_head, k_cache, v_cache, table, table_stride, lens, B, Hq, Hkv, group,
                            heads_per_item, block_size, scale, masking))
        return 0;
    // any other head size: the row-at-a-time path below
    const int64_t items_per_seq = Hkv / heads_per_item;
    const int64_t num_items = B * items_per_seq;
#pragma omp parallel
    {
        Scratch w;
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < num_items; ++item) {
            const int64_t b = item / items_per_seq, h0 = (item % items_per_seq) * heads_per_item;
            const RowSpan r = row_span(table + b * table_stride, lens[b], masking.window, block_size);
            attend<T>(out + (b * Hq + h0 * group) * D, q + b * q_tok + h0 * group * q_head, q_head, k_cache,
                      v_cache, r.table, r.len, h0, h0 + heads_per_item, Hkv, group, D, block_size, scale,
                      score_mods(r, masking, h0 * group), w);
        }
    }
    return 0;
}

}  // namespace rill_paged

namespace rill_cpu {

at::Tensor paged_decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                        const at::Tensor& block_table, const at::Tensor& context_lens,
                        const std::optional<at::Tensor>& k_new, const std::optional<at::Tensor>& v_new,
                        const std::optional<at::Tensor>& slot_mapping, int64_t window, double softcap,
                        const std::optional<at::Tensor>& sinks) {
    if (k_cache.scalar_type() == at::kChar)  // --kv-cache-dtype int8 (kv_int8.cpp)
        return paged_decode_int8(q, k_cache, v_cache, block_table, context_lens, k_new, v_new, slot_mapping, window,
                                 softcap, sinks);
    const bool bf16 = q.scalar_type() == at::kBFloat16;
    TORCH_CHECK((bf16 || q.scalar_type() == at::kFloat) && k_cache.scalar_type() == q.scalar_type() &&
                    v_cache.scalar_type() == q.scalar_type(),
                "paged_decode: float32 or bfloat16 queries and caches of the same dtype");
    TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1, "paged_decode: q [B, H, D] with contiguous rows");
    TORCH_CHECK(k_cache.dim() == 4 && k_cache.is_contiguous() && v_cache.is_contiguous(),
                "paged_decode: contiguous caches [blocks, block_size, H_kv, D]");
    const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2);
    const at::Tensor table = block_table.to(at::kLong).contiguous();
    const at::Tensor lens = context_lens.to(at::kLong).contiguous();
    const bool writes = k_new.has_value() && k_new->defined();
    at::Tensor slots;
    if (writes) {
        TORCH_CHECK(v_new.has_value() && slot_mapping.has_value(), "paged_decode: k_new needs v_new and slot_mapping");
        TORCH_CHECK(k_new->scalar_type() == q.scalar_type() && v_new->scalar_type() == q.scalar_type() &&
                        k_new->stride(-1) == 1 && v_new->stride(-1) == 1,
                    "paged_decode: k_new, v_new [B, H_kv, D] in q's dtype, rows contiguous");
        slots = slot_mapping->to(at::kLong).contiguous();
    }
    TORCH_CHECK(window >= 0 && softcap >= 0.0, "paged_decode: window and softcap are 0 (none) or positive");
    at::Tensor sink_logits;
    if (sinks.has_value() && sinks->defined()) {
        TORCH_CHECK(sinks->numel() == Hq, "paged_decode: sinks [H], one logit per query head");
        sink_logits = sinks->to(at::kFloat).contiguous();
    }
    const rill_paged::Masking masking{window, static_cast<float>(softcap),
                                      sink_logits.defined() ? sink_logits.data_ptr<float>() : nullptr};
    at::Tensor out = q.new_empty({B, Hq, D});
    auto call = [&](auto* typed) {  // the kernel on T = float or uint16_t (bfloat16 bits)
        using T = std::remove_pointer_t<decltype(typed)>;
        return rill_paged::run<T>(
            static_cast<T*>(out.data_ptr()), static_cast<const T*>(q.data_ptr()), q.stride(0), q.stride(1),
            writes ? static_cast<const T*>(k_new->data_ptr()) : nullptr, writes ? k_new->stride(0) : 0,
            writes ? k_new->stride(1) : 0, writes ? static_cast<const T*>(v_new->data_ptr()) : nullptr,
            writes ? v_new->stride(0) : 0, writes ? v_new->stride(1) : 0, static_cast<T*>(k_cache.data_ptr()),
            static_cast<T*>(v_cache.data_ptr()), writes ? slots.data_ptr<int64_t>() : nullptr,
            table.data_ptr<int64_t>(), table.stride(0), lens.data_ptr<int64_t>(), B, Hq, k_cache.size(2), D,
            k_cache.size(1), 1.0f / std::sqrt(static_cast<float>(D)), masking);
    };
    const int status = bf16 ? call(static_cast<uint16_t*>(nullptr)) : call(static_cast<float*>(nullptr));
    TORCH_CHECK(status == 0, "paged_decode: query heads must be a multiple of the KV heads");
    return out;
}

// The step's new K/V [T, H_kv, D] (each head's row contiguous) into their slots of the caches
// [blocks, block_size, H_kv, D] (write_slots, which the decode kernel uses for its own rows).
// aten's index_copy_ took about 40 us a layer for a 512-token prompt.
void write_kv(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k, const at::Tensor& v,
              const at::Tensor& slot_mapping) {
    if (k_cache.scalar_type() == at::kChar) return write_kv_int8(k_cache, v_cache, k, v, slot_mapping);
    TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.dim() == 4 && k.dim() == 3 &&
                    k.sizes() == v.sizes() && k.size(1) == k_cache.size(2) && k.size(2) == k_cache.size(3) &&
                    k.scalar_type() == k_cache.scalar_type() && v.scalar_type() == v_cache.scalar_type() &&
                    k.stride(2) == 1 && v.stride(2) == 1 && slot_mapping.size(0) == k.size(0),
                "write_kv: contiguous caches [blocks, block_size, H_kv, D], k and v [T, H_kv, D] of their dtype with "
                "contiguous rows, a slot per token");
    const at::Tensor slots = slot_mapping.to(at::kLong).contiguous();
    const int64_t* s = slots.data_ptr<int64_t>();
    const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
    for (int64_t t = 0; t < k.size(0); ++t) TORCH_CHECK(s[t] >= 0 && s[t] < num_slots, "write_kv: a slot past the cache");
    rill_paged::write_slots(static_cast<char*>(k_cache.data_ptr()), static_cast<char*>(v_cache.data_ptr()),
                            static_cast<const char*>(k.data_ptr()), k.stride(0), k.stride(1),
                            static_cast<const char*>(v.data_ptr()), v.stride(0), v.stride(1), s, k.size(0), k.size(1),
                            k.size(2), k.element_size());
}

namespace {

// The KV cache of each layer, set once by the engine (engine_proc/model/decode_graphs.py): the compiled
// decode graph names a layer instead of passing its cache, which torch.compile would otherwise
// treat as mutated and copy every step. Kept here, not in Python (engine_proc/attention/backend.py
// has its own for rill::paged_decode_attention): this operator runs inside the compiled step without
// the interpreter, so it cannot look a layer up in a Python list.
std::vector<std::pair<at::Tensor, at::Tensor>> kv_caches;

}  // namespace

void set_kv_caches(const std::vector<at::Tensor>& k, const std::vector<at::Tensor>& v) {
    TORCH_CHECK(k.size() == v.size(), "set_kv_caches: one V cache per K cache");
    kv_caches.clear();
    for (size_t i = 0; i < k.size(); ++i) kv_caches.emplace_back(k[i], v[i]);
}

at::Tensor paged_decode_layer(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& slot_mapping, const at::Tensor& block_table,
                              const at::Tensor& context_lens, int64_t layer, int64_t window, double softcap,
                              const std::optional<at::Tensor>& sinks) {
    TORCH_CHECK(layer >= 0 && layer < static_cast<int64_t>(kv_caches.size()), "paged_decode_layer: no cache for layer ",
                layer);
    return paged_decode(q, kv_caches[layer].first, kv_caches[layer].second, block_table, context_lens, k, v, slot_mapping,
                        window, softcap, sinks);
}

}  // namespace rill_cpu
