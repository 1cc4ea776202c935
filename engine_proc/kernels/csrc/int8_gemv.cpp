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
// quantized per group of 32 to int8 (scale max|x| / 127, the int4 kernel's rounding) and one vpdpbusd multiplies
// 64 weights: it takes unsigned bytes on one side, so the activations go in as |q| and their signs move onto the
// weights (a masked negation; the weights are within +-127). Per 64 weights and row: 4 instructions. float32
// activations keep the float path: exact, as a float32 model asks.
#define RILL_INT8_VNNI 1

// The activations of M rows per 64-weight chunk: magnitudes, sign masks, and each lane's group scale (lanes
// 0-7 hold the chunk's first group of 32, lanes 8-15 its second).
struct QuantizedRows {
    std::vector<uint8_t> mag;    // [M, C * 64], zero past K
    std::vector<uint64_t> sign;  // [M, C]
    std::vector<float> scale;    // [M, C, 16]
};

inline void quantize_rows(const float* xf, int64_t M, int64_t Kp, int64_t C, QuantizedRows& out) {
    out.mag.assign(M * C * 64, 0);
    out.sign.assign(M * C, 0);
    out.scale.assign(M * C * 16, 0.0f);
    for (int64_t m = 0; m < M; ++m) {
        for (int64_t g = 0; g * 32 < Kp; ++g) {  // 32 values, or the last 16 (Kp is a multiple of 16)
            const int64_t k = 32 * g;
            const __m512 a = _mm512_loadu_ps(xf + m * Kp + k);
            const __m512 b = k + 32 <= Kp ? _mm512_loadu_ps(xf + m * Kp + k + 16) : _mm512_setzero_ps();
            __m128i qa, qb;
            const float amax = rill_simd::quantize32(a, b, qa, qb);
            const __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(qa), qb, 1);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.mag.data() + m * C * 64 + k), _mm256_abs_epi8(q));
            out.sign[m * C + k / 64] |= uint64_t{static_cast<uint32_t>(_mm256_movemask_epi8(q))} << (k % 64);
            float* lanes = out.scale.data() + (m * C + g / 2) * 16 + 8 * (g % 2);
            for (int l = 0; l < 8; ++l) lanes[l] = amax / 127.0f;
        }
    }
}

template <int R, int M, typename T>
void rows_vnni(T* y, int64_t y_stride, const QuantizedRows& x, int64_t C, const int8_t* w, int64_t Kp,
               const uint16_t* scale, int64_t n0, int64_t n1) {
    const __mmask64 tail = Kp % 64 ? (uint64_t{1} << (Kp % 64)) - 1 : ~uint64_t{0};
    const __m512i zero = _mm512_setzero_si512();
    int64_t n = n0;
    for (; n + R <= n1; n += R) {
        __m512 acc[R][M];
        for (int r = 0; r < R; ++r)
            for (int m = 0; m < M; ++m) acc[r][m] = _mm512_setzero_ps();
        const int8_t* w0 = w + n * Kp;
        rill_simd::prefetch_block(w0, R * Kp);
        const int64_t next_rows = std::min<int64_t>(R, n1 - n - R);  // and the next block's, as int4_gemv.cpp's
        for (int64_t c = 0; c < C; ++c) {
            const __mmask64 valid = c + 1 < C ? ~uint64_t{0} : tail;  // the masked bytes are not read
            __m512i wv[R];
            for (int r = 0; r < R; ++r) wv[r] = _mm512_maskz_loadu_epi8(valid, w0 + r * Kp + 64 * c);
            for (int r = 0; r < next_rows; ++r) __builtin_prefetch(w0 + (R + r) * Kp + 64 * c, 0, 3);
            for (int m = 0; m < M; ++m) {
                const __m512i mag = _mm512_loadu_si512(x.mag.data() + (m * C + c) * 64);
                const __mmask64 neg = x.sign[m * C + c];
                const __m512 sx = _mm512_loadu_ps(x.scale.data() + (m * C + c) * 16);
                for (int r = 0; r < R; ++r) {
                    const __m512i signed_w = _mm512_mask_sub_epi8(wv[r], neg, zero, wv[r]);
                    const __m512i dot = _mm512_dpbusd_epi32(zero, mag, signed_w);
                    acc[r][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), sx, acc[r][m]);
                }
            }
        }
        for (int r = 0; r < R; ++r) {
            const float s = to_float(scale[n + r]);
            for (int m = 0; m < M; ++m) store(y + m * y_stride + n + r, s * _mm512_reduce_add_ps(acc[r][m]));
        }
    }
    if (n < n1) rows_vnni<1, M, T>(y, y_stride, x, C, w, Kp, scale, n, n1);
}

template <int M, typename T>
void gemv_vnni(T* y, int64_t y_stride, const QuantizedRows& x, int64_t C, const int8_t* w, int64_t Kp,
               const uint16_t* scale, int64_t N) {
    rill_simd::split_rows(N, [&](int64_t n0, int64_t n1) {
        rows_vnni<(M <= 2 ? 4 : 2), M, T>(y, y_stride, x, C, w, Kp, scale, n0, n1);
    });
}

// The bfloat16 rows, eight a pass (each pass reads the whole weight).
inline void run_vnni(uint16_t* y, int64_t y_stride, const float* xf, int64_t M, const int8_t* w, int64_t Kp,
                     const uint16_t* scale, int64_t N) {
    const int64_t C = (Kp + 63) / 64;
    thread_local QuantizedRows qx;
    for (int64_t m = 0; m < M;) {
        const int64_t now = std::min<int64_t>(M - m, 8);
        quantize_rows(xf + m * Kp, now, Kp, C, qx);
        uint16_t* out = y + m * y_stride;
        rill_simd::with_rows(now, [&](auto rows) { gemv_vnni<decltype(rows)::value>(out, y_stride, qx, C, w, Kp, scale, N); });
        m += now;
    }
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
