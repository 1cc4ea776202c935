// Rill's CPU kernels as torch operators (namespace rill_cpu): every operator's schema and its
// implementation, registered here; the kernels are the other translation units of this folder, one
// per family, declared in their headers. A decode step calls them without Python: through ctypes
// and a Python custom op, each call cost 30-60 us of interpreter and tensor bookkeeping inside a
// step (measured at batch 1, where the step had just streamed the weights through the caches),
// against 1 us for a registered operator.
//
// Built and loaded by engine_proc/kernels/extension.py against the running torch's headers.
#include <torch/library.h>

#include "amx_linear.h"
#include "elementwise.h"
#include "int4_gemv.h"
#include "int8_gemv.h"
#include "kv_int8.h"
#include "moe_experts.h"
#include "paged_decode.h"
#include "prefill_attention.h"
#include "prefill_layer.h"
#include "quant_panels.h"

TORCH_LIBRARY(rill_cpu, m) {
    m.def("paged_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, Tensor context_lens, "
          "Tensor? k_new=None, Tensor? v_new=None, Tensor? slot_mapping=None, int window=0, float softcap=0.0, "
          "Tensor? sinks=None) -> Tensor");
    m.def("set_kv_caches(Tensor[] k, Tensor[] v) -> ()");
    m.def("write_kv(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k, Tensor v, Tensor slot_mapping) -> ()");
    m.def("kv_int8_gather(Tensor cache, Tensor block_table, int length, Tensor like) -> Tensor");
    m.def("paged_decode_layer(Tensor q, Tensor k, Tensor v, Tensor slot_mapping, Tensor block_table, "
          "Tensor context_lens, int layer, int window=0, float softcap=0.0, Tensor? sinks=None) -> Tensor");
    m.def("int8_gemv(Tensor x, Tensor weight_int8, Tensor scale, int in_features) -> Tensor");
    m.def("int8_linear(Tensor x, Tensor weight_int8, Tensor scale, int in_features, int gemv_max_rows, "
          "int chunk_elems) -> Tensor");
    m.def("int4_gemv(Tensor x, Tensor packed, Tensor scales, Tensor offsets, int in_features) -> Tensor");
    m.def("int4_dequant(Tensor packed, Tensor scales, Tensor offsets, int in_features, int start, int count, "
          "Tensor like) -> Tensor");
    m.def("quant_panels_supported() -> bool");
    m.def("quant_panels_kernel(str? use=None) -> str");
    m.def("int4_linear(Tensor x, Tensor packed, Tensor scales, Tensor offsets, int in_features, int gemv_max_rows, "
          "int chunk_elems) -> Tensor");
    m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
    m.def("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)");
    m.def("rope_(Tensor(a!) x, Tensor cos, Tensor sin, int num_heads) -> ()");
    m.def("silu_mul(Tensor gate_up) -> Tensor");
    m.def("soft_cap(Tensor x, float cap) -> Tensor");
    m.def("moe_experts(Tensor x, Tensor top_k_index, Tensor top_k_weights, Tensor[] gate_up, Tensor?[] gate_up_bias, "
          "Tensor[] down, Tensor?[] down_bias, int intermediate, int hidden, str gate, float alpha=1.0, "
          "float limit=0.0) -> Tensor");
    m.def("moe_experts_int8(Tensor x, Tensor top_k_index, Tensor top_k_weights, Tensor[] gate_up, "
          "Tensor[] gate_up_scale, Tensor?[] gate_up_bias, Tensor[] down, Tensor[] down_scale, Tensor?[] down_bias, "
          "int intermediate, int hidden, str gate, float alpha, float limit, int gemv_max_rows, int chunk_elems) -> Tensor");
    m.def("prefill_attention_supported() -> bool");
    m.def("prefill_attention(Tensor q, Tensor k, Tensor v) -> Tensor");
    m.def("amx_linear_supported() -> bool");
    m.def("amx_linear_kernel(str? use=None) -> str");
    m.def("amx_linear_pack(Tensor weight) -> Tensor");
    m.def("amx_linear(Tensor x, Tensor packed, Tensor? bias, int out_features, bool fixed_tiles=False) -> Tensor");
    m.def("amx_linear_silu_mul(Tensor x, Tensor packed, Tensor? bias, int out_features, bool fixed_tiles=False) -> Tensor");
    m.def("amx_linear_rope(Tensor x, Tensor packed, Tensor? bias, int out_features, bool fixed_tiles, Tensor cos, "
          "Tensor sin, int rope_cols) -> Tensor");
    m.def("prefill_layer(Tensor h, Tensor? residual, Tensor[] weights, Tensor?[] biases, int[] out_features, float eps, "
          "Tensor cos, Tensor sin, int num_heads, int num_kv_heads, Tensor(a!) k_cache, Tensor(b!) v_cache, "
          "Tensor slot_mapping, int[] bounds, Tensor? rows) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(rill_cpu, CPU, m) {
    m.impl("paged_decode", &rill_cpu::paged_decode);
    m.impl("paged_decode_layer", &rill_cpu::paged_decode_layer);
    m.impl("write_kv", &rill_cpu::write_kv);
    m.impl("kv_int8_gather", &rill_cpu::kv_int8_gather);
    m.impl("int8_gemv", &rill_cpu::int8_gemv);
    m.impl("int8_linear", &rill_cpu::int8_linear);
    m.impl("int4_gemv", &rill_cpu::int4_gemv);
    m.impl("int4_dequant", &rill_cpu::int4_dequant);
    m.impl("int4_linear", &rill_cpu::int4_linear);
    m.impl("rms_norm", &rill_cpu::rms_norm);
    m.impl("add_rms_norm", &rill_cpu::add_rms_norm);
    m.impl("rope_", &rill_cpu::rope_);
    m.impl("silu_mul", &rill_cpu::silu_mul);
    m.impl("soft_cap", &rill_cpu::soft_cap);
    m.impl("moe_experts", &rill_cpu::moe_experts);
    m.impl("moe_experts_int8", &rill_cpu::moe_experts_int8);
    m.impl("prefill_attention", &rill_cpu::prefill_attention);
    m.impl("amx_linear_pack", &rill_cpu::amx_linear_pack);
    m.impl("amx_linear", &rill_cpu::amx_linear);
    m.impl("amx_linear_silu_mul", &rill_cpu::amx_linear_silu_mul);
    m.impl("amx_linear_rope", &rill_cpu::amx_linear_rope);
    m.impl("prefill_layer", &rill_cpu::prefill_layer);
}

// No tensor to dispatch on: one implementation for every backend.
TORCH_LIBRARY_IMPL(rill_cpu, CompositeExplicitAutograd, m) {
    m.impl("set_kv_caches", &rill_cpu::set_kv_caches);
    m.impl("prefill_attention_supported", &rill_cpu::prefill_attention_supported);
    m.impl("amx_linear_supported", &rill_cpu::amx_linear_supported);
    m.impl("amx_linear_kernel", &rill_cpu::amx_linear_kernel);
    m.impl("quant_panels_supported", &rill_cpu::quant_panels_supported);
    m.impl("quant_panels_kernel", &rill_cpu::quant_panels_kernel);
}
