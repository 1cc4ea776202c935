// A mixture-of-experts layer's experts in one call (moe_experts.cpp): the operator
// rill_cpu::moe_silu_experts, whose schema bindings.cpp registers.
#pragma once
#include <ATen/core/Tensor.h>

#include <vector>

namespace rill_cpu {

// x [T, H] bfloat16; each token's experts top_k_index [T, k] and weights top_k_weights [T, k]; each
// expert's gate-and-up projection (gate its first half) and down projection packed by
// amx_linear_pack (out features 2 * intermediate and hidden). The weighted sum over each token's
// experts, in its top-k order: [T, hidden] bfloat16.
at::Tensor moe_silu_experts(const at::Tensor& x, const at::Tensor& top_k_index, const at::Tensor& top_k_weights,
                            const std::vector<at::Tensor>& gate_up, const std::vector<at::Tensor>& down,
                            int64_t intermediate, int64_t hidden);

}  // namespace rill_cpu
