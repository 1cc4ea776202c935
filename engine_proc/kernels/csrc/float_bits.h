// Scalar helpers shared by the CPU kernels (each translation unit of csrc/ includes what it uses):
// bfloat16 bits to float and back, a vectorizable e^x, and the 16-float vector type.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace rill_float {

// 16 floats: one zmm register with AVX-512, a pair of ymm with AVX2 (GCC vector extensions).
typedef float v16f __attribute__((vector_size(64)));

inline float to_float(float x) { return x; }
inline float to_float(uint16_t x) {  // bfloat16 bits
    uint32_t u = static_cast<uint32_t>(x) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline void store(float* p, float x) { *p = x; }
inline void store(uint16_t* p, float x) {  // round to nearest even, as torch does
    uint32_t u;
    std::memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        *p = 0x7fc0;  // NaN
        return;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    *p = static_cast<uint16_t>(u >> 16);
}

// e^x with x clamped to [-87, 87] (softmax's e^(s - max), silu's e^-a): Cephes' exp2f polynomial
// on a rounded exponent, branch-free so the loops around it vectorize (std::exp would be a scalar
// call per element without -ffast-math); about 2 ulp.
inline float exp_clamped(float x) {
    x = x < -87.0f ? -87.0f : (x > 87.0f ? 87.0f : x);
    const float t = x * 1.44269504088896341f;
    const float n = std::nearbyint(t);
    const float f = t - n;  // [-0.5, 0.5]
    float p = 1.535336188319500e-4f;
    p = p * f + 1.339887440266574e-3f;
    p = p * f + 9.618437357674640e-3f;
    p = p * f + 5.550332471162809e-2f;
    p = p * f + 2.402264791363012e-1f;
    p = p * f + 6.931472028550421e-1f;
    p = p * f + 1.0f;
    const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, 4);
    return p * scale;
}

// silu(g) * u and a step of rotate-half RoPE, one lane: elementwise.cpp's loops and the scalar
// epilogues of amx_linear.cpp both call these (as their AVX-512 paths share bf16_simd.h's), so a
// fused op and the separate ones give the same bits on every build.
inline float silu_mul(float g, float u) { return g / (1.0f + exp_clamped(-g)) * u; }

inline void rope(float x1, float x2, float c, float s, float& y1, float& y2) {
    y1 = x1 * c - x2 * s;
    y2 = x2 * c + x1 * s;
}

}  // namespace rill_float
