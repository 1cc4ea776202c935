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
// vector extensions and a few intrinsics: AVX-512 and AVX2 builds come from the same source.
#include "int8_gemv.h"
#include "quant_panels.h"

#include <ATen/ops/linear_ops.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "float_bits.h"
#include "simd16.h"

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
// arguments: the R x M accumulators stay in registers). The weight rows PREFETCH_ROWS ahead are
// fetched into L1 a line at a time: left to the hardware prefetcher, a core streamed the weights
// at about half its bandwidth (measured: 7 against 13 GB/s, the whole model at one row).
constexpr int64_t PREFETCH_ROWS = 16;

template <int R, int M, typename T>
void rows(T* y, int64_t y_stride, const float* xf, int64_t Kp, const int8_t* w, int64_t w_stride,
          const uint16_t* scale, int64_t n0, int64_t n1) {
    const int8_t* end = w + n1 * w_stride;
    int64_t n = n0;
    for (; n + R <= n1; n += R) {
        v16f acc[R][M] = {};
        const int8_t* w0 = w + n * w_stride;
        const int8_t* ahead = w0 + PREFETCH_ROWS * w_stride;  // R rows, contiguous
        for (int64_t b = 0; b < R * w_stride && ahead + b < end; b += 64) __builtin_prefetch(ahead + b, 0, 3);
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
