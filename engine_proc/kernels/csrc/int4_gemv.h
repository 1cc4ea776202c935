// Weight-only 4-bit linears (int4_gemv.cpp): the operators rill_cpu::int4_gemv, rill_cpu::int4_dequant and
// rill_cpu::int4_linear, whose schemas bindings.cpp registers.
//
// The layout (engine_proc/kernels/int4_linear.py makes it, from a float weight or a GGUF Q4_0/Q4_1
// tensor): a weight [N, K] in groups of 32 along K, K padded with zeros to Kp, a multiple of 64 (whole pairs of
// groups, which the AVX512-VNNI kernel takes at once).
//   packed  uint8 [N, Kp / 2]: group g of row n is bytes 16g..16g+15; byte j holds element 32g + j in its
//           low four bits and element 32g + 16 + j in its high four (GGUF's Q4_0 and Q4_1 order);
//   scales  float16 [N, Kp / 32] and offsets float16 [N, Kp / 32]: w = q * scale + offset, q in 0..15
//           (Q4_0's symmetric blocks have offset = -8 * scale).
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <cstring>
#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace rill_int4 {

struct Weight {
    const uint8_t* packed;  // [N, Kp / 2]
    const uint16_t* scales;  // [N, Kp / 32] float16 bits
    const uint16_t* offsets;
    int64_t Kp;
};

inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
    if (exp == 0x1fu) {
        bits = sign | 0x7f800000u | (mant << 13);  // inf, NaN
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else {  // subnormal: normalize
        exp = 113u;
        while (!(mant & 0x400u)) {
            mant <<= 1;
            --exp;
        }
        bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
#endif
}

// The layout's pointers, checked.
inline Weight weight_of(const at::Tensor& packed, const at::Tensor& scales, const at::Tensor& offsets,
                        int64_t in_features) {
    const int64_t N = packed.size(0), Kp = packed.size(1) * 2;
    TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 2 && packed.is_contiguous() && Kp % 64 == 0 &&
                    Kp >= in_features && Kp < in_features + 64,
                "int4: a packed uint8 weight [N, Kp / 2], Kp the in_features rounded up to 64, contiguous");
    for (const at::Tensor* t : {&scales, &offsets})
        TORCH_CHECK(t->scalar_type() == at::kHalf && t->is_contiguous() && t->dim() == 2 && t->size(0) == N &&
                        t->size(1) == Kp / 32,
                    "int4: float16 scales and offsets [N, Kp / 32], contiguous");
    return {packed.data_ptr<uint8_t>(), reinterpret_cast<const uint16_t*>(scales.data_ptr()),
            reinterpret_cast<const uint16_t*>(offsets.data_ptr()), Kp};
}

}  // namespace rill_int4

namespace rill_cpu {

// x [M, K] (float32 or bfloat16, rows contiguous) @ w.T, every weight read once per 8 rows.
at::Tensor int4_gemv(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                     const at::Tensor& offsets, int64_t in_features);
// Rows [start, start + count) of w as `like`'s dtype: [count, in_features].
at::Tensor int4_dequant(const at::Tensor& packed, const at::Tensor& scales, const at::Tensor& offsets,
                        int64_t in_features, int64_t start, int64_t count, const at::Tensor& like);
// The GEMV up to gemv_max_rows rows; above, int4_linear_panels (quant_panels.h) where it takes x, else w converted to x's dtype,
// chunk_elems at a time, and oneDNN's GEMM (engine_proc/kernels/int4_linear.py passes both figures).
at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                       const at::Tensor& offsets, int64_t in_features, int64_t gemv_max_rows, int64_t chunk_elems);


}  // namespace rill_cpu
