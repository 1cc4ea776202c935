// A prompt chunk's causal attention through AMX micro-kernels (prefill_attention.cpp): the operators
// rill_cpu::prefill_attention_supported and prefill_attention, whose schemas bindings.cpp registers.
#pragma once
#include <ATen/core/Tensor.h>

namespace rill_cpu {

bool prefill_attention_supported();
// q [Tq, H, D] over k, v [Tk, H_kv, D] (the chunk's tokens the last Tq keys), bfloat16, D a multiple of 64.
at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

}  // namespace rill_cpu
