// Weight-only int8 matrix-vector products for decode steps: y[m, n] = s[n] * sum_k x[m, k] * w[n, k]
// for a few rows m of activations (bfloat16 or float32) against an int8 weight [N, Kp] with one
// bfloat16 scale per output channel (engine_proc/kernels/int8_linear.py makes them).
//
// A decode step reads every weight once; at one row that is all it does, so the speed is the
// memory bandwidth, and what loses it is overhead: torch's _weight_int8pack_mm reached about half
// of it on the bundled model's small matrices. Here each thread streams a contiguous range of
// weight rows, four at a time, converting 16 int8 values to floats with two instructions
// (sign-extend, convert) and multiplying them into every activation row.
//
// The operators rill_cpu::int8_gemv and rill_cpu::int8_linear (bindings.cpp registers them). GCC
// vector extensions and a few intrinsics: AVX-512 and AVX2 builds come from the same source. bfloat16 activations
// take integer dot products where the CPU has them: AVX512-VNNI below, AVX2's vpmaddubsw in int8_gemv_avx2.h.
#include "int8_gemv.h"
#include "quant_panels.h"

#include <ATen/ops/linear_ops.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "float_bits.h"
#include "simd16.h"
#if defined(__AVX2__) && defined(__FMA__) && !(defined(__AVX512VNNI__) && defined(__AVX512BW__))
#include "int8_gemv_avx2.h"
#define RILL_INT8_AVX2 1
#endif

namespace rill_gemv {

using rill_float::store;
using rill_float::to_float;
using rill_float::v16f;
using rill_simd::fma16;
using rill_simd::hsum;

// 16 int8 weights as floats. GCC scalarizes a vector-extension conversion from int8, so: sign-extend
// and convert with intrinsics (one zmm, or two ymm halves on AVX2).
inline v16f weights16(const int8_t* p) {
#if defined(__AVX512F__)
    const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
    v16f out;
    std::memcpy(&out, &f, sizeof out);
    return out;
#elif defined(__AVX2__)
    const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
    const __m256 hi =
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8))));
    v16f out;
    std::memcpy(&out, &lo, 32);
    std::memcpy(reinterpret_cast<char*>(&out) + 32, &hi, 32);
    return out;
#else
    v16f out;
    for (int l = 0; l < 16; ++l) out[l] = p[l];
    return out;
#endif
}
// Rows [n0, n1) of the output for M activation rows, R weight rows at a time (M and R template
// arguments: the R x M accumulators stay in registers), each block's rows prefetched first (prefetch_block).

template <int R, int M, typename T>
void rows(T* y, int64_t y_stride, const float* xf, int64_t Kp, const int8_t* w, int64_t w_stride,
          const uint16_t* scale, int64_t n0, int64_t n1) {
    int64_t n = n0;
    for (; n + R <= n1; n += R) {
        v16f acc[R][M] = {};
        const int8_t* w0 = w + n * w_stride;
        rill_simd::prefetch_block(w0, R * w_stride);  // R rows, contiguous
        for (int64_t k = 0; k < Kp; k += 16) {
            v16f wv[R];
            for (int r = 0; r < R; ++r) wv[r] = weights16(w0 + r * w_stride + k);
            for (int m = 0; m < M; ++m) {
                v16f xv;
                std::memcpy(&xv, xf + m * Kp + k, sizeof xv);
                for (int r = 0; r < R; ++r) acc[r][m] = fma16(wv[r], xv, acc[r][m]);
            }
        }
        for (int r = 0; r < R; ++r) {
            const float s = to_float(scale[n + r]);
            for (int m = 0; m < M; ++m) store(y + m * y_stride + n + r, s * hsum(acc[r][m]));
        }
    }
    if (n < n1) rows<1, M, T>(y, y_stride, xf, Kp, w, w_stride, scale, n, n1);
}

template <int M, typename T>
void gemv(T* y, int64_t y_stride, const float* xf, int64_t Kp, const int8_t* w, int64_t w_stride,
          const uint16_t* scale, int64_t N) {
    rill_simd::split_rows(N, [&](int64_t n0, int64_t n1) {
        rows<(M <= 4 ? 4 : 2), M, T>(y, y_stride, xf, Kp, w, w_stride, scale, n0, n1);
    });
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// With AVX512-VNNI, bfloat16 activations: integer dot products, as llama.cpp's Q8_0 x Q8_0 kernel does. The
// float path above spends 3 instructions on each 16 weights (widen, convert, FMA) and was compute-bound at about
// half the memory bandwidth on a Zen 4 (the Qwen2.5-1.5B head: 17 ms, 2.2x its floor). Here each activation row is
// quantized per group of 32 to int8 (scale max|x| / 127, the int4 kernel's rounding). vpdpbusd takes unsigned
// bytes on one side: the weights go in as w + 128 (one XOR a weight row, shared by every activation row), and each
// activation row's sum_k 128 * x_k, taken from its rounded values, comes off at the end. float32 activations keep
// the float path: exact, as a float32 model asks.
//
// As int4_gemv.cpp's quads: 128 weights (four groups of 32) a step, their 128-bit quarters reordered once a weight
// row (each group's elements 0-15, group after group, then 16-31), so that two vpdpbusd sum each group into four
// lanes of its own and one conversion and one FMA take the 128 into float32. (With the activations' signs moved
// onto the weights, 64 weights a conversion: 8 instructions where this takes 4, and Qwen2.5-1.5B's head at 8 rows
// took 1.7x its time at one row on a 2-core Xeon.)
#define RILL_INT8_VNNI 1

// The activations of M rows per 128-weight chunk in the reordered weights' order, zero past K; per chunk, each
// group's scale over its four lanes; per row, 128 * sum_k x_k of the rounded values.
struct QuantizedRows {
    std::vector<int8_t> q;       // [M, C * 128]
    std::vector<float> scale;    // [M, C, 16]
    std::vector<float> bias;     // [M]
};

inline void quantize_rows(const float* xf, int64_t M, int64_t Kp, int64_t C, QuantizedRows& out) {
    out.q.assign(M * C * 128, 0);
    out.scale.assign(M * C * 16, 0.0f);
    out.bias.assign(M, 0.0f);
    for (int64_t m = 0; m < M; ++m) {
        for (int64_t g = 0; g * 32 < Kp; ++g) {  // 32 values, or the last 16 (Kp is a multiple of 16)
            const int64_t k = 32 * g;
            const __m512 a = _mm512_loadu_ps(xf + m * Kp + k);
            const __m512 b = k + 32 <= Kp ? _mm512_loadu_ps(xf + m * Kp + k + 16) : _mm512_setzero_ps();
            __m128i qa, qb;
            const float scale = rill_simd::quantize32(a, b, qa, qb) / 127.0f;
            int8_t* dst = out.q.data() + m * C * 128 + 128 * (g / 4) + 16 * (g % 4);
            _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), qa);
            _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 64), qb);
            for (int l = 0; l < 4; ++l) out.scale[(m * C + g / 4) * 16 + 4 * (g % 4) + l] = scale;
            const __m512i wide = _mm512_add_epi32(_mm512_cvtepi8_epi32(qa), _mm512_cvtepi8_epi32(qb));
            out.bias[m] += 128.0f * scale * static_cast<float>(_mm512_reduce_add_epi32(wide));
        }
    }
}

// 128 weights of a row from p (the first `valid` of them; the rest zero) as unsigned bytes w + 128, reordered:
// lo holds each of the four groups' elements 0-15, hi their 16-31.
inline void quad_weights(const int8_t* p, int64_t valid, __m512i& lo, __m512i& hi) {
    const __m512i v0 = _mm512_maskz_loadu_epi8(rill_simd::byte_mask(valid), p),
                  v1 = _mm512_maskz_loadu_epi8(rill_simd::byte_mask(valid - 64), p + 64);
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    lo = _mm512_xor_si512(_mm512_shuffle_i32x4(v0, v1, 0x88), flip);
    hi = _mm512_xor_si512(_mm512_shuffle_i32x4(v0, v1, 0xdd), flip);
}

template <int R, int M, typename T>
void rows_vnni(T* y, int64_t y_stride, const QuantizedRows& x, int64_t m0, int64_t C, const int8_t* w, int64_t Kp,
               const uint16_t* scale, int64_t n0, int64_t n1, int64_t n_end) {
    int64_t n = n0;
    for (; n + R <= n1; n += R) {
        __m512 acc[R][M];
        for (int r = 0; r < R; ++r)
            for (int m = 0; m < M; ++m) acc[r][m] = _mm512_setzero_ps();
        const int8_t* w0 = w + n * Kp;
        rill_simd::prefetch_block(w0, R * Kp);
        const int64_t next_rows = std::clamp<int64_t>(n_end - n - R, 0, R);  // and the next block's, as int4_gemv.cpp's
        for (int64_t c = 0; c < C; ++c) {
            __m512i lo[R], hi[R];
            for (int r = 0; r < R; ++r) quad_weights(w0 + r * Kp + 128 * c, Kp - 128 * c, lo[r], hi[r]);
            for (int r = 0; r < next_rows; ++r) {
                __builtin_prefetch(w0 + (R + r) * Kp + 128 * c, 0, 3);
                __builtin_prefetch(w0 + (R + r) * Kp + 128 * c + 64, 0, 3);
            }
            for (int m = 0; m < M; ++m) {
                const int8_t* xq = x.q.data() + ((m0 + m) * C + c) * 128;
                const __m512i x_lo = _mm512_loadu_si512(xq), x_hi = _mm512_loadu_si512(xq + 64);
                const __m512 sx = _mm512_loadu_ps(x.scale.data() + ((m0 + m) * C + c) * 16);
                for (int r = 0; r < R; ++r) {
                    const __m512i dot = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[r], x_lo),
                                                            hi[r], x_hi);
                    acc[r][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), sx, acc[r][m]);
                }
            }
        }
        for (int r = 0; r < R; ++r) {
            const float s = to_float(scale[n + r]);
            for (int m = 0; m < M; ++m)
                store(y + m * y_stride + n + r, s * (_mm512_reduce_add_ps(acc[r][m]) - x.bias[m0 + m]));
        }
    }
    if (n < n1) rows_vnni<1, M, T>(y, y_stride, x, m0, C, w, Kp, scale, n, n1, n_end);
}

// The bfloat16 rows, over simd16.h's row_blocks (the weight read from memory once a call).
inline void run_vnni(uint16_t* y, int64_t y_stride, const float* xf, int64_t M, const int8_t* w, int64_t Kp,
                     const uint16_t* scale, int64_t N) {
    const int64_t C = (Kp + 127) / 128;
    thread_local QuantizedRows qx;
    quantize_rows(xf, M, Kp, C, qx);
    const QuantizedRows& x = qx;  // this thread's: a thread_local named in the workers would be theirs
    rill_simd::row_blocks(N, Kp, M, [&](int64_t b0, int64_t b1, int64_t n_end, int64_t m, auto rows) {
        constexpr int rows_now = decltype(rows)::value;
        rows_vnni<rows_now <= 2 ? 4 : 2, rows_now, uint16_t>(y + m * y_stride, y_stride, x, m, C, w, Kp, scale, b0, b1,
                                                            n_end);
    });
}
#endif

template <typename T>
int run(T* y, int64_t y_stride, const T* x, int64_t x_stride, int64_t M, int64_t K, const int8_t* w, int64_t Kp,
        const uint16_t* scale, int64_t N) {
    if (Kp % 16 != 0 || Kp < K) return 1;
    // The activations as floats, zero past K (the weight's padding columns are zero too).
    thread_local std::vector<float> buf;
    buf.assign(M * Kp, 0.0f);
    for (int64_t m = 0; m < M; ++m)
        for (int64_t k = 0; k < K; ++k) buf[m * Kp + k] = to_float(x[m * x_stride + k]);
    const float* xf = buf.data();
#ifdef RILL_INT8_VNNI
    if constexpr (std::is_same_v<T, uint16_t>) return run_vnni(y, y_stride, xf, M, w, Kp, scale, N), 0;
#elif defined(RILL_INT8_AVX2)
    if constexpr (std::is_same_v<T, uint16_t>) return avx2::run(y, y_stride, xf, M, w, Kp, scale, N), 0;
#endif
    switch (M) {
        case 1: return gemv<1, T>(y, y_stride, xf, Kp, w, Kp, scale, N), 0;
        case 2: return gemv<2, T>(y, y_stride, xf, Kp, w, Kp, scale, N), 0;
        case 3: return gemv<3, T>(y, y_stride, xf, Kp, w, Kp, scale, N), 0;
        case 4: return gemv<4, T>(y, y_stride, xf, Kp, w, Kp, scale, N), 0;
        default: break;
    }
    // More rows: eight at a time (each pass reads the whole weight again).
    int64_t m = 0;
    for (; m + 8 <= M; m += 8) gemv<8, T>(y + m * y_stride, y_stride, xf + m * Kp, Kp, w, Kp, scale, N);
    switch (M - m) {
        case 0: return 0;
        case 1: return gemv<1, T>(y + m * y_stride, y_stride, xf + m * Kp, Kp, w, Kp, scale, N), 0;
        case 2: return gemv<2, T>(y + m * y_stride, y_stride, xf + m * Kp, Kp, w, Kp, scale, N), 0;
        case 3: return gemv<3, T>(y + m * y_stride, y_stride, xf + m * Kp, Kp, w, Kp, scale, N), 0;
        case 4: return gemv<4, T>(y + m * y_stride, y_stride, xf + m * Kp, Kp, w, Kp, scale, N), 0;
        case 5: return gemv<5, T>(y + m * y_stride, y_stride, xf + m * Kp, Kp, w, Kp, scale, N), 0;
        case 6: return gemv<6, T>(y + m * y_stride, y_stride, xf + m * Kp, Kp, w, Kp, scale, N), 0;
        default: return gemv<7, T>(y + m * y_stride, y_stride, xf + m * Kp, Kp, w, Kp, scale, N), 0;
    }
}

}  // namespace rill_gemv

namespace rill_cpu {

at::Tensor int8_gemv(const at::Tensor& x, const at::Tensor& weight_int8, const at::Tensor& scale, int64_t in_features) {
    const bool bf16 = x.scalar_type() == at::kBFloat16;
    TORCH_CHECK((bf16 || x.scalar_type() == at::kFloat) && x.dim() == 2 && x.stride(1) == 1,
                "int8_gemv: x [M, K] float32 or bfloat16, rows contiguous");
    TORCH_CHECK(weight_int8.scalar_type() == at::kChar && weight_int8.is_contiguous() &&
                    scale.scalar_type() == at::kBFloat16 && scale.is_contiguous(),
                "int8_gemv: an int8 weight [N, Kp] and bfloat16 scales [N], contiguous");
    at::Tensor y = x.new_empty({x.size(0), weight_int8.size(0)});
    auto call = [&](auto* typed) {  // T = float or uint16_t (bfloat16 bits)
        using T = std::remove_pointer_t<decltype(typed)>;
        return rill_gemv::run<T>(static_cast<T*>(y.data_ptr()), y.stride(0), static_cast<const T*>(x.data_ptr()),
                                 x.stride(0), x.size(0), in_features, weight_int8.data_ptr<int8_t>(),
                                 weight_int8.size(1), reinterpret_cast<const uint16_t*>(scale.data_ptr()),
                                 weight_int8.size(0));
    };
    const int status = bf16 ? call(static_cast<uint16_t*>(nullptr)) : call(static_cast<float*>(nullptr));
    TORCH_CHECK(status == 0, "int8_gemv: the weight's row length must be a multiple of 16, at least in_features");
    return y;
}

namespace {

// F.linear's operator; through its _ops entry rather than <ATen/ops/linear.h>, whose includes
// took two seconds of this file's compile.
at::Tensor linear(const at::Tensor& x, const at::Tensor& w) { return at::_ops::linear::call(x, w, std::nullopt); }

// The converted weight's GEMM, chunk_elems of it at a time, the scales on the output:
// engine_proc/kernels/int8_linear.py's dequantized_matmul, the same ATen calls.
at::Tensor dequantized_matmul(const at::Tensor& x, const at::Tensor& weight_int8, const at::Tensor& scale,
                              int64_t in_features, int64_t chunk_elems) {
    const at::Tensor q = weight_int8.narrow(1, 0, in_features);
    const int64_t N = q.size(0), rows_per_chunk = std::max<int64_t>(1, chunk_elems / in_features);
    at::Tensor y;
    if (N <= rows_per_chunk) {
        y = linear(x, q.to(x.scalar_type()));
    } else {
        y = x.new_empty({x.size(0), N});
        for (int64_t start = 0; start < N; start += rows_per_chunk) {
            const int64_t n = std::min(rows_per_chunk, N - start);
            y.narrow(1, start, n).copy_(linear(x, q.narrow(0, start, n).to(x.scalar_type())));
        }
    }
    return y.mul_(scale.to(x.scalar_type()));
}

}  // namespace

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& weight_int8, const at::Tensor& scale, int64_t in_features,
                       int64_t gemv_max_rows, int64_t chunk_elems) {
    if (x.size(0) <= gemv_max_rows) return int8_gemv(x.stride(1) == 1 ? x : x.contiguous(), weight_int8, scale, in_features);
    if (quant_panels_take(x, in_features)) return int8_linear_panels(x, weight_int8, scale, in_features);
    return dequantized_matmul(x, weight_int8, scale, in_features, chunk_elems);
}

}  // namespace rill_cpu
