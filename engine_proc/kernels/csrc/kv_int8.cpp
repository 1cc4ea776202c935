// The int8 KV cache (--kv-cache-dtype int8): rows quantized as they are written, and paged decode
// attention that reads them where they lie, dequantizing inside the kernel. The operators
// rill_cpu::paged_decode and write_kv come here for an int8 cache (paged_decode.cpp); bindings.cpp
// registers kv_int8_gather.
//
// A row is D int8 values then its float32 scale (engine_proc/attention/kv_int8.py, the torch twin:
// the same division and rounding, so a write gives the same bytes). The scale is applied once per
// row: to the dot product in the K pass, to the probability in the V pass; the values convert int8
// to float 16 at a time (GCC's vector extensions: AVX-512, AVX2 or SSE2 as the build targets). Head
// sizes of 32, 64 or 128 take that tiled path; any other the row-at-a-time one.
#include "kv_int8.h"

#include <immintrin.h>

#include <cmath>
#include <type_traits>

#include "paged_decode_kernels.h"
#ifdef _OPENMP
#include <omp.h>
#endif

namespace rill_kv8 {
namespace {

using namespace rill_paged;
constexpr int64_t kScaleBytes = 4;
typedef int8_t v16c __attribute__((vector_size(16)));

// 16 int8 values as floats: sign-extended to int32, then converted (vpmovsxbd, vcvtdq2ps). GCC's
// __builtin_convertvector from int8 compiles to scalar code (a byte at a time), which made the
// kernel 4x slower than the bfloat16 one; it stays only for a build below AVX2 (SSE2 has no vpmovsxbd).
inline v16f load16(const int8_t* p) {
    v16f out;
#if defined(__AVX512F__)
    const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
    std::memcpy(&out, &f, sizeof out);
#elif defined(__AVX2__)
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(x));
    const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(x, 8)));
    std::memcpy(&out, &lo, sizeof lo);
    std::memcpy(reinterpret_cast<char*>(&out) + sizeof lo, &hi, sizeof hi);
#else
    v16c x;
    std::memcpy(&x, p, sizeof x);
    out = __builtin_convertvector(x, v16f);
#endif
    return out;
}
inline float scale_of(const int8_t* row, int64_t D) {
    float s;
    std::memcpy(&s, row + D, sizeof s);
    return s;
}

// D values of T into one int8 row and its scale (amax / 127; 0 and zeros for a row of zeros).
template <typename T>
void quantize_row(int8_t* dst, const T* src, int64_t D) {
    float amax = 0.0f;
    for (int64_t d = 0; d < D; ++d) {
        const float a = std::fabs(to_float(src[d]));
        amax = a > amax ? a : amax;
    }
    const float scale = amax / 127.0f, div = scale > 0.0f ? scale : 1.0f;
    for (int64_t d = 0; d < D; ++d) {
        float r = std::nearbyint(to_float(src[d]) / div);
        r = r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r);
        dst[d] = static_cast<int8_t>(r);
    }
    std::memcpy(dst + D, &scale, sizeof scale);
}

template <typename T>
void write_rows(int8_t* k_cache, int8_t* v_cache, const T* k, int64_t k_tok, int64_t k_head, const T* v, int64_t v_tok,
                int64_t v_head, const int64_t* slots, int64_t n, int64_t Hkv, int64_t D) {
    const int64_t row = D + kScaleBytes;
#pragma omp parallel for schedule(static) if (n > 16)
    for (int64_t t = 0; t < n; ++t)
        for (int64_t h = 0; h < Hkv; ++h) {
            quantize_row(k_cache + (slots[t] * Hkv + h) * row, k + t * k_tok + h * k_head, D);
            quantize_row(v_cache + (slots[t] * Hkv + h) * row, v + t * v_tok + h * v_head, D);
        }
}

struct Scratch {
    std::vector<v16f> q, acc;
    std::vector<float> qf, accf, scores;
};

// One sequence's KV heads [h0, h1), D = 16 * C: the tiled path's 16 tokens at a time (as
// paged_decode_tiled.cpp), each tile's 16 row scales multiplied into its 16 scores at once.
template <typename T, int C>
void attend_tiled(T* out, const T* q, int64_t q_head, const int8_t* k_cache, const int8_t* v_cache,
                  const int64_t* table, int64_t len, int64_t h0, int64_t h1, int64_t Hkv, int64_t group,
                  int64_t block_size, float scale, const ScoreMods& mods, Scratch& w) {
    constexpr int64_t D = 16 * C, row = D + kScaleBytes;
    const int64_t nh = h1 - h0, nq = nh * group, srow = len + 16, token_stride = Hkv * row;
    w.q.resize(nq * C);
    w.acc.assign(nq * C, v16f{});
    w.scores.resize(nq * srow);
    v16f* qv = w.q.data();
    v16f* acc = w.acc.data();
    float* s = w.scores.data();
    for (int64_t j = 0; j < nq; ++j)
        for (int c = 0; c < C; ++c) qv[j * C + c] = rill_paged::load16(q + j * q_head + 16 * c) * scale;
    const int64_t num_blocks = (len + block_size - 1) / block_size;
    auto prefetch = [&](int64_t blk) {  // as the tiled path: K two blocks ahead, V into cache for its pass
        if (blk >= num_blocks) return;
        const int64_t offset = (table[blk] * block_size * Hkv + h0) * row;
        for (int64_t i = 0; i < block_size; ++i)
            for (int64_t b = 0; b < nh * row; b += 64) {
                __builtin_prefetch(k_cache + offset + i * token_stride + b, 0, 3);
                touch(reinterpret_cast<const char*>(v_cache + offset + i * token_stride + b));
            }
    };
    prefetch(0);
    prefetch(1);
    v16f tile[16][C];
    float ts[16];
    for (int64_t blk = 0, b0 = 0; blk < num_blocks; ++blk, b0 += block_size) {
        prefetch(blk + 2);
        const int8_t* kb = k_cache + (table[blk] * block_size * Hkv + h0) * row;
        const int64_t block_len = len - b0 < block_size ? len - b0 : block_size;
        for (int64_t i0 = 0; i0 < block_len; i0 += 16) {
            const int64_t n = block_len - i0 < 16 ? block_len - i0 : 16;
            for (int64_t h = 0; h < nh; ++h) {
                for (int64_t i = 0; i < 16; ++i) {
                    const int8_t* kr = kb + (i0 + i) * token_stride + h * row;
                    ts[i] = i < n ? scale_of(kr, D) : 0.0f;
                    for (int c = 0; c < C; ++c) tile[i][c] = i < n ? load16(kr + 16 * c) : v16f{};
                }
                const v16f tile_scales = rill_paged::load16(ts);
                for (int64_t g = 0; g < group; ++g) {
                    const int64_t j = h * group + g;
                    v16f part[16];
                    for (int64_t i = 0; i < 16; ++i) {
                        v16f a = qv[j * C] * tile[i][0];
                        for (int c = 1; c < C; ++c) a += qv[j * C + c] * tile[i][c];
                        part[i] = a;
                    }
                    const v16f scores = hsum16(part) * tile_scales;
                    std::memcpy(s + j * srow + b0 + i0, &scores, sizeof scores);
                }
            }
        }
    }
    std::vector<float> inv_sum(nq);
    softmax_rows(s, nq, len, srow, inv_sum.data(), mods);
    for (int64_t blk = 0, b0 = 0; blk < num_blocks; ++blk, b0 += block_size) {
        const int8_t* vb = v_cache + (table[blk] * block_size * Hkv + h0) * row;
        const int64_t block_len = len - b0 < block_size ? len - b0 : block_size;
        for (int64_t i0 = 0; i0 < block_len; i0 += 16) {
            const int64_t n = block_len - i0 < 16 ? block_len - i0 : 16;
            for (int64_t h = 0; h < nh; ++h) {
                for (int64_t i = 0; i < n; ++i) {
                    const int8_t* vr = vb + (i0 + i) * token_stride + h * row;
                    ts[i] = scale_of(vr, D);
                    for (int c = 0; c < C; ++c) tile[i][c] = load16(vr + 16 * c);
                }
                for (int64_t g = 0; g < group; ++g) {
                    const int64_t j = h * group + g;
                    const float* p = s + j * srow + b0 + i0;
                    v16f a[C];
                    for (int c = 0; c < C; ++c) a[c] = acc[j * C + c];
                    for (int64_t i = 0; i < n; ++i) {
                        const float pi = p[i] * ts[i];
                        for (int c = 0; c < C; ++c) a[c] += pi * tile[i][c];
                    }
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

// Any head size: a row at a time, in plain loops (the compiler vectorizes what it can).
template <typename T>
void attend_rows(T* out, const T* q, int64_t q_head, const int8_t* k_cache, const int8_t* v_cache,
                 const int64_t* table, int64_t len, int64_t h0, int64_t h1, int64_t Hkv, int64_t group, int64_t D,
                 int64_t block_size, float scale, const ScoreMods& mods, Scratch& w) {
    const int64_t nh = h1 - h0, nq = nh * group, row = D + kScaleBytes, token_stride = Hkv * row;
    w.qf.resize(nq * D);
    w.accf.assign(nq * D, 0.0f);
    w.scores.resize(nq * len);
    float* qf = w.qf.data();
    float* acc = w.accf.data();
    float* s = w.scores.data();
    for (int64_t j = 0; j < nq; ++j)
        for (int64_t d = 0; d < D; ++d) qf[j * D + d] = to_float(q[j * q_head + d]) * scale;
    auto row_at = [&](const int8_t* cache, int64_t t, int64_t h) {
        return cache + (table[t / block_size] * block_size + t % block_size) * token_stride + (h0 + h) * row;
    };
    for (int64_t t = 0; t < len; ++t)
        for (int64_t j = 0; j < nq; ++j) {
            const int8_t* kr = row_at(k_cache, t, j / group);
            const float* qj = qf + j * D;
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < D; ++d) dot += qj[d] * static_cast<float>(kr[d]);
            s[j * len + t] = dot * scale_of(kr, D);
        }
    std::vector<float> inv_sum(nq);
    softmax_rows(s, nq, len, len, inv_sum.data(), mods);
    for (int64_t t = 0; t < len; ++t)
        for (int64_t j = 0; j < nq; ++j) {
            const int8_t* vr = row_at(v_cache, t, j / group);
            const float p = s[j * len + t] * scale_of(vr, D);
            float* aj = acc + j * D;
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) aj[d] += p * static_cast<float>(vr[d]);
        }
    for (int64_t j = 0; j < nq; ++j)
        for (int64_t d = 0; d < D; ++d) store(out + j * D + d, acc[j * D + d] * inv_sum[j]);
}

template <typename T>
void run(T* out, const T* q, int64_t q_tok, int64_t q_head, const int8_t* k_cache, const int8_t* v_cache,
         const int64_t* table, int64_t table_stride, const int64_t* lens, int64_t B, int64_t Hq, int64_t Hkv,
         int64_t D, int64_t block_size, float scale, const Masking& masking) {
    const int64_t group = Hq / Hkv;
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    const int64_t heads_per_item = B >= 2 * threads ? Hkv : 1;  // as paged_decode.cpp's run
    const int64_t items_per_seq = Hkv / heads_per_item, num_items = B * items_per_seq;
#pragma omp parallel
    {
        Scratch w;
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < num_items; ++item) {
            const int64_t b = item / items_per_seq, h0 = (item % items_per_seq) * heads_per_item;
            const RowSpan r = row_span(table + b * table_stride, lens[b], masking.window, block_size);
            T* o = out + (b * Hq + h0 * group) * D;
            const T* qb = q + b * q_tok + h0 * group * q_head;
            const int64_t h1 = h0 + heads_per_item;
            const ScoreMods mods = score_mods(r, masking, h0 * group);
            switch (D) {
                case 32: attend_tiled<T, 2>(o, qb, q_head, k_cache, v_cache, r.table, r.len, h0, h1, Hkv, group,
                                            block_size, scale, mods, w); break;
                case 64: attend_tiled<T, 4>(o, qb, q_head, k_cache, v_cache, r.table, r.len, h0, h1, Hkv, group,
                                            block_size, scale, mods, w); break;
                case 128: attend_tiled<T, 8>(o, qb, q_head, k_cache, v_cache, r.table, r.len, h0, h1, Hkv, group,
                                             block_size, scale, mods, w); break;
                default: attend_rows<T>(o, qb, q_head, k_cache, v_cache, r.table, r.len, h0, h1, Hkv, group, D,
                                        block_size, scale, mods, w);
            }
        }
    }
}

// Calls f with a typed null pointer: float for float32, uint16_t (bfloat16 bits) for bfloat16.
template <typename F>
void with_type(const at::Tensor& t, F&& f) {
    if (t.scalar_type() == at::kBFloat16)
        f(static_cast<uint16_t*>(nullptr));
    else
        f(static_cast<float*>(nullptr));
}

}  // namespace
}  // namespace rill_kv8

namespace rill_cpu {

void write_kv_int8(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k, const at::Tensor& v,
                   const at::Tensor& slot_mapping) {
    const auto dt = k.scalar_type();
    TORCH_CHECK(k_cache.scalar_type() == at::kChar && v_cache.scalar_type() == at::kChar && k_cache.is_contiguous() &&
                    v_cache.is_contiguous() && k_cache.dim() == 4 && k.dim() == 3 && k.sizes() == v.sizes() &&
                    (dt == at::kFloat || dt == at::kBFloat16) && v.scalar_type() == dt && k.size(1) == k_cache.size(2) &&
                    k.size(2) + rill_kv8::kScaleBytes == k_cache.size(3) && k.stride(2) == 1 && v.stride(2) == 1 &&
                    slot_mapping.size(0) == k.size(0),
                "write_kv_int8: int8 caches [blocks, block_size, H_kv, D + 4], k and v [T, H_kv, D] float32 or "
                "bfloat16 with contiguous rows, a slot per token");
    const at::Tensor slots = slot_mapping.to(at::kLong).contiguous();
    const int64_t* s = slots.data_ptr<int64_t>();
    const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
    for (int64_t t = 0; t < k.size(0); ++t) TORCH_CHECK(s[t] >= 0 && s[t] < num_slots, "write_kv: a slot past the cache");
    rill_kv8::with_type(k, [&](auto* typed) {
        using T = std::remove_pointer_t<decltype(typed)>;
        rill_kv8::write_rows<T>(static_cast<int8_t*>(k_cache.data_ptr()), static_cast<int8_t*>(v_cache.data_ptr()),
                                static_cast<const T*>(k.data_ptr()), k.stride(0), k.stride(1),
                                static_cast<const T*>(v.data_ptr()), v.stride(0), v.stride(1), s, k.size(0), k.size(1),
                                k.size(2));
    });
}

at::Tensor paged_decode_int8(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                             const at::Tensor& block_table, const at::Tensor& context_lens,
                             const std::optional<at::Tensor>& k_new, const std::optional<at::Tensor>& v_new,
                             const std::optional<at::Tensor>& slot_mapping, int64_t window, double softcap,
                             const std::optional<at::Tensor>& sinks) {
    TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16,
                "paged_decode: float32 or bfloat16 queries over an int8 cache");
    TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1, "paged_decode: q [B, H, D] with contiguous rows");
    TORCH_CHECK(k_cache.dim() == 4 && k_cache.size(3) == q.size(2) + rill_kv8::kScaleBytes &&
                    v_cache.scalar_type() == at::kChar && k_cache.is_contiguous() && v_cache.is_contiguous(),
                "paged_decode: contiguous int8 caches [blocks, block_size, H_kv, D + 4]");
    const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2), Hkv = k_cache.size(2);
    TORCH_CHECK(Hkv > 0 && Hq % Hkv == 0, "paged_decode: query heads must be a multiple of the KV heads");
    TORCH_CHECK(window >= 0 && softcap >= 0.0, "paged_decode: window and softcap are 0 (none) or positive");
    if (k_new.has_value() && k_new->defined()) {
        TORCH_CHECK(v_new.has_value() && slot_mapping.has_value(), "paged_decode: k_new needs v_new and slot_mapping");
        write_kv_int8(k_cache, v_cache, *k_new, *v_new, *slot_mapping);
    }
    const at::Tensor table = block_table.to(at::kLong).contiguous();
    const at::Tensor lens = context_lens.to(at::kLong).contiguous();
    at::Tensor sink_logits;
    if (sinks.has_value() && sinks->defined()) {
        TORCH_CHECK(sinks->numel() == Hq, "paged_decode: sinks [H], one logit per query head");
        sink_logits = sinks->to(at::kFloat).contiguous();
    }
    const rill_paged::Masking masking{window, static_cast<float>(softcap),
                                      sink_logits.defined() ? sink_logits.data_ptr<float>() : nullptr};
    at::Tensor out = q.new_empty({B, Hq, D});
    rill_kv8::with_type(q, [&](auto* typed) {
        using T = std::remove_pointer_t<decltype(typed)>;
        rill_kv8::run<T>(static_cast<T*>(out.data_ptr()), static_cast<const T*>(q.data_ptr()), q.stride(0), q.stride(1),
                         static_cast<const int8_t*>(k_cache.data_ptr()), static_cast<const int8_t*>(v_cache.data_ptr()),
                         table.data_ptr<int64_t>(), table.stride(0), lens.data_ptr<int64_t>(), B, Hq, Hkv, D,
                         k_cache.size(1), 1.0f / std::sqrt(static_cast<float>(D)), masking);
    });
    return out;
}

at::Tensor kv_int8_gather(const at::Tensor& cache, const at::Tensor& block_table, int64_t length,
                          const at::Tensor& like) {
    TORCH_CHECK(cache.scalar_type() == at::kChar && cache.dim() == 4 && cache.is_contiguous(),
                "kv_int8_gather: a contiguous int8 cache [blocks, block_size, H_kv, D + 4]");
    TORCH_CHECK(like.scalar_type() == at::kFloat || like.scalar_type() == at::kBFloat16,
                "kv_int8_gather: float32 or bfloat16 out");
    const int64_t block_size = cache.size(1), Hkv = cache.size(2), row = cache.size(3);
    const int64_t D = row - rill_kv8::kScaleBytes;
    const at::Tensor table = block_table.to(at::kLong).contiguous();
    TORCH_CHECK(length >= 0 && length <= table.numel() * block_size, "kv_int8_gather: more rows than the blocks hold");
    const int64_t* blocks = table.data_ptr<int64_t>();
    for (int64_t i = 0; i < table.numel(); ++i)
        TORCH_CHECK(blocks[i] >= 0 && blocks[i] < cache.size(0), "kv_int8_gather: a block past the cache");
    at::Tensor out = like.new_empty({length, Hkv, D});
    const int8_t* src = static_cast<const int8_t*>(cache.data_ptr());
    rill_kv8::with_type(like, [&](auto* typed) {
        using T = std::remove_pointer_t<decltype(typed)>;
        T* dst = static_cast<T*>(out.data_ptr());
#pragma omp parallel for schedule(static) if (length > 64)
        for (int64_t t = 0; t < length; ++t)
            for (int64_t h = 0; h < Hkv; ++h) {
                const int8_t* r = src + ((blocks[t / block_size] * block_size + t % block_size) * Hkv + h) * row;
                const float s = rill_kv8::scale_of(r, D);
                for (int64_t d = 0; d < D; ++d) rill_float::store(dst + (t * Hkv + h) * D + d, static_cast<float>(r[d]) * s);
            }
    });
    return out;
}

}  // namespace rill_cpu
