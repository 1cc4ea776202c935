// A mixture-of-experts layer's experts in one call (moe_experts.cpp): the operator
// rill_cpu::moe_experts and moe_experts_int8, whose schemas bindings.cpp registers.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/core/List.h>

#include <string_view>

namespace rill_cpu {

// x [T, H] bfloat16; each token's experts top_k_index [T, k] and weights top_k_weights [T, k]; each
// expert's gate-and-up and down projections packed by amx_linear_pack (out features 2 * intermediate
// and hidden) with their float32 biases or none. `gate`: "silu" (silu(gate) * up, gate the first
// half: Mixtral, Qwen3-MoE) or "clamped_swiglu" (GPT-OSS: gate and up interleaved, clamped at
// `limit`, (up + 1) * gate * sigmoid(alpha * gate)). The weighted sum over each token's experts, in
// its top-k order: [T, hidden] bfloat16.
at::Tensor moe_experts(const at::Tensor& x, const at::Tensor& top_k_index, const at::Tensor& top_k_weights,
                       at::TensorList gate_up, const c10::List<std::optional<at::Tensor>>& gate_up_bias,
                       at::TensorList down, const c10::List<std::optional<at::Tensor>>& down_bias,
                       int64_t intermediate, int64_t hidden, std::string_view gate, double alpha, double limit);

// The same with weight-only int8 projections (int8_gemv.h's int8_linear: int8 weights, a scale per
// output channel, their biases in the activations' dtype or none).
at::Tensor moe_experts_int8(const at::Tensor& x, const at::Tensor& top_k_index, const at::Tensor& top_k_weights,
                            at::TensorList gate_up, at::TensorList gate_up_scale,
                            const c10::List<std::optional<at::Tensor>>& gate_up_bias, at::TensorList down,
                            at::TensorList down_scale, const c10::List<std::optional<at::Tensor>>& down_bias,
                            int64_t intermediate, int64_t hidden, std::string_view gate, double alpha, double limit,
                            int64_t gemv_max_rows, int64_t chunk_elems);

}  // namespace rill_cpu
