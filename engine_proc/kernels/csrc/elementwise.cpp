// The elementwise parts of an eager step (prefill and mixed steps) fused, one pass each: RMSNorm,
// rotate-half RoPE in place, and SiLU(gate) * up. Eager torch ran each as several ops with a
// bfloat16 rounding and a pass over memory between them: a 512-token prefill of the bundled model
// spent about 33 ms of its 130 there. Compiled decode steps do not use these: Inductor fuses the
// same arithmetic into its own loops. Math in float32, rounded once to the output's dtype, as
// Inductor does; each row is computed alone, the same whatever else is in the step.
//
// The operators rill_cpu::rms_norm, add_rms_norm, rope_, silu_mul and soft_cap (bindings.cpp registers them).
#include "elementwise.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "bf16_simd.h"
#include "float_bits.h"
#ifdef _OPENMP
#include <omp.h>
#endif

namespace rill_elementwise {
namespace {

using rill_float::store;
using rill_float::to_float;

// y[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w, rows of n; x rows `x_stride` apart, y contiguous.
// With `add` and `sum` (contiguous): the row is first x[t] + add[t], rounded to T and written to
// sum[t] (the residual stream's next value), and the norm is of that rounded sum: the bits of an
// add followed by rms_norm, in one pass instead of two.
template <typename T>
inline void rms_norm_row(T* yr, const T* xr, const T* w, int64_t n, float eps, const T* ar, T* sr) {
    if (ar) {
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) store(sr + i, to_float(xr[i]) + to_float(ar[i]));
        xr = sr;
    }
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < n; ++i) ss += to_float(xr[i]) * to_float(xr[i]);
    const float r = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) store(yr + i, to_float(xr[i]) * r * to_float(w[i]));
}
#ifdef RILL_BF16_SIMD
// In bfloat16, written out: GCC's vectorisation of the rounding above took about half the time.
// The sum of squares is 16 partial sums, then their total: a fixed order, whatever the batch.
template <>
inline void rms_norm_row(uint16_t* yr, const uint16_t* xr, const uint16_t* w, int64_t n, float eps,
                         const uint16_t* ar, uint16_t* sr) {
    __m512 ss = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = rill_simd::tail_mask(n - i);
        __m512 v = rill_simd::load_bf16(xr + i, m);
        if (ar) {
            v = rill_simd::round_bf16(_mm512_add_ps(v, rill_simd::load_bf16(ar + i, m)));
            rill_simd::store_bf16(sr + i, v, m);
        }
        ss = _mm512_fmadd_ps(v, v, ss);
    }
    const __m512 r = _mm512_set1_ps(1.0f / std::sqrt(_mm512_reduce_add_ps(ss) / static_cast<float>(n) + eps));
    const uint16_t* src = ar ? sr : xr;
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = rill_simd::tail_mask(n - i);
        const __m512 v = _mm512_mul_ps(_mm512_mul_ps(rill_simd::load_bf16(src + i, m), r), rill_simd::load_bf16(w + i, m));
        rill_simd::store_bf16(yr + i, v, m);
    }
}
#endif

template <typename T>
void rms_norm(T* y, const T* x, int64_t x_stride, const T* w, int64_t rows, int64_t n, float eps,
              const T* add = nullptr, T* sum = nullptr) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < rows; ++t)
        rms_norm_row(y + t * n, x + t * x_stride, w, n, eps, add ? add + t * n : nullptr, add ? sum + t * n : nullptr);
}

// In place on the first `heads` heads of x [T, *, D] (token stride x_tok, head stride x_head):
// (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) with cos, sin [T, D/2] (rows cs_stride apart).
template <typename T>
inline void rope_head(T* xr, const T* c, const T* s, int64_t half) {
#ifdef RILL_BF16_SIMD
    if constexpr (sizeof(T) == 2) {
        if (half % 16 == 0) {  // written out, as silu_mul_row: the same arithmetic as the fused epilogue
            for (int64_t i = 0; i < half; i += 16) {
                __m512 y1, y2;
                rill_simd::rope16(rill_simd::load_bf16(xr + i), rill_simd::load_bf16(xr + half + i),
                                  rill_simd::load_bf16(c + i), rill_simd::load_bf16(s + i), y1, y2);
                rill_simd::store_bf16(xr + i, y1);
                rill_simd::store_bf16(xr + half + i, y2);
            }
            return;
        }
    }
#endif
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
        float y1, y2;
        rill_float::rope(to_float(xr[i]), to_float(xr[half + i]), to_float(c[i]), to_float(s[i]), y1, y2);
        store(xr + i, y1);
        store(xr + half + i, y2);
    }
}

template <typename T>
void rope(T* x, int64_t x_tok, int64_t x_head, const T* cos, const T* sin, int64_t cs_stride, int64_t rows,
          int64_t heads, int64_t D) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < rows; ++t)
        for (int64_t h = 0; h < heads; ++h) rope_head(x + t * x_tok + h * x_head, cos + t * cs_stride, sin + t * cs_stride, D / 2);
}

// One row of silu(g) * u.
template <typename T>
inline void silu_mul_row(T* y, const T* g, const T* u, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) store(y + i, rill_float::silu_mul(to_float(g[i]), to_float(u[i])));
}
#ifdef RILL_BF16_SIMD
// In bfloat16, written out (GCC's vectorisation of the loop above took 2-3x the time): the same
// arithmetic as amx_linear.cpp's fused epilogue, so both give the same bits.
template <>
inline void silu_mul_row(uint16_t* y, const uint16_t* g, const uint16_t* u, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = rill_simd::tail_mask(n - i);
        const __m512 a = rill_simd::load_bf16(g + i, m), b = rill_simd::load_bf16(u + i, m);
        rill_simd::store_bf16(y + i, rill_simd::silu_mul(a, b), m);
    }
}
#endif

// y [T, n] = silu(gate) * up, where gate_up [T, 2n] holds gate then up in each row.
template <typename T>
void silu_mul(T* y, const T* gate_up, int64_t gu_stride, int64_t rows, int64_t n) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < rows; ++t) silu_mul_row(y + t * n, gate_up + t * gu_stride, gate_up + t * gu_stride + n, n);
}

// y = cap * tanh(x / cap) over n contiguous values (a family's final logit soft-capping), written
// as cap - 2 cap / (e^(2x / cap) + 1) on exp_clamped, which vectorizes: torch's tanh took 0.8 ms for
// a 16-row step's logits (49152 wide) on a Zen 4, Inductor's sigmoid form 0.3 ms.
template <typename T>
void soft_cap(T* y, const T* x, int64_t n, float cap) {
    const float k = 2.0f / cap, twice = 2.0f * cap;
    constexpr int64_t piece = 8192;
#pragma omp parallel for schedule(static) if (n > 4 * piece)
    for (int64_t i0 = 0; i0 < n; i0 += piece) {
        const int64_t i1 = n - i0 < piece ? n : i0 + piece;
#pragma omp simd
        for (int64_t i = i0; i < i1; ++i) store(y + i, cap - twice / (rill_float::exp_clamped(to_float(x[i]) * k) + 1.0f));
    }
}

}  // namespace
}  // namespace rill_elementwise

namespace rill_cpu {

namespace {

void check_float(const at::Tensor& t, const char* what) {
    TORCH_CHECK((t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16) && t.device().is_cpu(), what,
                ": a float32 or bfloat16 CPU tensor");
}

// The pointer of a float32 tensor's data as float, of a bfloat16 one's as uint16_t (its bits).
template <typename T>
T* data(const at::Tensor& t) {
    return static_cast<T*>(t.data_ptr());
}

// f(T{}) with T the kernels' element type for x's dtype (checked by check_float).
template <typename F>
void on_dtype(const at::Tensor& x, F&& f) {
    if (x.scalar_type() == at::kFloat)
        f(float{});
    else
        f(uint16_t{});
}

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
    check_float(x, "rms_norm");
    const int64_t n = x.size(-1);
    TORCH_CHECK(weight.scalar_type() == x.scalar_type() && weight.is_contiguous() && weight.numel() == n,
                "rms_norm: a contiguous weight [n] in x's dtype");
    const at::Tensor x2 = x.reshape({-1, n});
    TORCH_CHECK(x2.stride(1) == 1, "rms_norm: rows must be contiguous");
    at::Tensor y = x.new_empty(x.sizes());
    on_dtype(x, [&](auto t) {
        using T = decltype(t);
        rill_elementwise::rms_norm(data<T>(y), data<const T>(x2), x2.stride(0), data<const T>(weight), x2.size(0), n,
                                   static_cast<float>(eps));
    });
    return y;
}

// (residual + x, rms_norm(residual + x)): the sum rounded once, as the two ops give it.
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight,
                                                double eps) {
    check_float(x, "add_rms_norm");
    const int64_t n = x.size(-1);
    TORCH_CHECK(weight.scalar_type() == x.scalar_type() && weight.is_contiguous() && weight.numel() == n &&
                    residual.scalar_type() == x.scalar_type() && residual.sizes() == x.sizes(),
                "add_rms_norm: x and residual of one shape and dtype, a contiguous weight [n] in it");
    const at::Tensor x2 = x.reshape({-1, n}).contiguous(), r2 = residual.reshape({-1, n}).contiguous();
    at::Tensor sum = x.new_empty(x.sizes()), y = x.new_empty(x.sizes());
    on_dtype(x, [&](auto t) {
        using T = decltype(t);
        rill_elementwise::rms_norm(data<T>(y), data<const T>(x2), n, data<const T>(weight), x2.size(0), n,
                                   static_cast<float>(eps), data<const T>(r2), data<T>(sum));
    });
    return {sum, y};
}

void rope_(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t num_heads) {
    check_float(x, "rope_");
    TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1 && num_heads <= x.size(1), "rope_: x [T, heads, D], rows contiguous");
    const int64_t T = x.size(0), D = x.size(2);
    const at::Tensor c = cos.reshape({T, D / 2}), s = sin.reshape({T, D / 2});
    TORCH_CHECK(c.scalar_type() == x.scalar_type() && s.scalar_type() == x.scalar_type() && c.stride(1) == 1 &&
                    s.stride(1) == 1 && c.stride(0) == s.stride(0) && D % 2 == 0,
                "rope_: cos and sin [T, 1, D/2] in x's dtype");
    on_dtype(x, [&](auto t) {
        using E = decltype(t);
        rill_elementwise::rope(data<E>(x), x.stride(0), x.stride(1), data<const E>(c), data<const E>(s), c.stride(0), T,
                               num_heads, D);
    });
}

at::Tensor soft_cap(const at::Tensor& x, double cap) {
    check_float(x, "soft_cap");
    TORCH_CHECK(cap > 0.0, "soft_cap: a positive cap");
    const at::Tensor xc = x.contiguous();
    at::Tensor y = xc.new_empty(xc.sizes());
    on_dtype(x, [&](auto t) {
        using E = decltype(t);
        rill_elementwise::soft_cap(data<E>(y), data<const E>(xc), xc.numel(), static_cast<float>(cap));
    });
    return y;
}

at::Tensor silu_mul(const at::Tensor& gate_up) {
    check_float(gate_up, "silu_mul");
    TORCH_CHECK(gate_up.dim() == 2 && gate_up.stride(1) == 1 && gate_up.size(1) % 2 == 0,
                "silu_mul: gate_up [T, 2n], rows contiguous");
    const int64_t T = gate_up.size(0), n = gate_up.size(1) / 2;
    at::Tensor y = gate_up.new_empty({T, n});
    on_dtype(gate_up, [&](auto t) {
        using E = decltype(t);
        rill_elementwise::silu_mul(data<E>(y), data<const E>(gate_up), gate_up.stride(0), T, n);
    });
    return y;
}

}  // namespace rill_cpu
