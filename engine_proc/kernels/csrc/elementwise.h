// The eager step's fused elementwise ops (elementwise.cpp): the operators rill_cpu::rms_norm,
// add_rms_norm, rope_, silu_mul and soft_cap, whose schemas bindings.cpp registers.
#pragma once
#include <ATen/core/Tensor.h>

#include <tuple>

namespace rill_cpu {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
// (residual + x, rms_norm(residual + x)): the sum rounded once, as the two ops give it.
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight,
                                                double eps);
// In place: the first num_heads heads of x [T, heads, D] rotated by cos and sin [T, 1, D/2].
void rope_(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t num_heads);
// silu(gate) * up of gate_up [T, 2n]: [T, n].
at::Tensor silu_mul(const at::Tensor& gate_up);
// cap * tanh(x / cap), elementwise (a family's final logit soft-capping).
at::Tensor soft_cap(const at::Tensor& x, double cap);

}  // namespace rill_cpu
