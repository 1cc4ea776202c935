// A prompt step's decoder layer as one operator (prefill_layer.cpp): rill_cpu::prefill_layer,
// whose schema bindings.cpp registers.
#pragma once
#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace rill_cpu {

std::tuple<at::Tensor, at::Tensor> prefill_layer(const at::Tensor& h, const std::optional<at::Tensor>& residual,
                                                 at::TensorList weights, const c10::List<std::optional<at::Tensor>>& biases,
                                                 at::IntArrayRef out_features, double eps, const at::Tensor& cos,
                                                 const at::Tensor& sin, int64_t num_heads, int64_t num_kv_heads,
                                                 const at::Tensor& k_cache, const at::Tensor& v_cache,
                                                 const at::Tensor& slot_mapping, at::IntArrayRef bounds,
                                                 const std::optional<at::Tensor>& rows);

}  // namespace rill_cpu
