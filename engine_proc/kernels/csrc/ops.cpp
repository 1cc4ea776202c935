// Rill's CPU kernels as torch operators (namespace rill_cpu), so a decode step calls them without
// Python: through ctypes and a Python custom op, each call cost 30-60 us of interpreter and
// tensor bookkeeping inside a step (measured at batch 1, where the step had just streamed the
// weights through the caches), against 1 us for a registered operator.
//
// Built and loaded by engine_proc/cpu_kernels.py against the running torch's headers; the
// kernels themselves are the plain C++ of the other files here (amx_ops.cpp wraps the AMX ones).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <torch/library.h>

#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "amx_ops.cpp"
#include "elementwise.cpp"
#include "int8_gemv.cpp"
#include "paged_decode.cpp"
#include "prefill_layer.cpp"

namespace {

// Rows up to which int8_linear takes the GEMV; above, oneDNN's GEMM on the converted weight
// (the GEMV reads the weight once per 8 rows: at 16 rows it took 26 ms for the bundled model,
// the converted GEMM 39; the crossover is near 24). quantization.py's GEMV_MAX_ROWS is the same.
constexpr int64_t kGemvMaxRows = 24;
// The converted weight is made a slice of about this many elements at a time.
constexpr int64_t kDequantChunkElems = int64_t{1} << 21;

int dtype_code(const at::Tensor& t) {
    if (t.scalar_type() == at::kFloat) return 0;
    if (t.scalar_type() == at::kBFloat16) return 1;
    return -1;
}

at::Tensor paged_decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                        const at::Tensor& block_table, const at::Tensor& context_lens,
                        const std::optional<at::Tensor>& k_new, const std::optional<at::Tensor>& v_new,
                        const std::optional<at::Tensor>& slot_mapping) {
    const int code = dtype_code(q);
    TORCH_CHECK(code >= 0 && k_cache.scalar_type() == q.scalar_type() && v_cache.scalar_type() == q.scalar_type(),
                "paged_decode: float32 or bfloat16 queries and caches of the same dtype");
    TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1, "paged_decode: q [B, H, D] with contiguous rows");
    TORCH_CHECK(k_cache.dim() == 4 && k_cache.is_contiguous() && v_cache.is_contiguous(),
                "paged_decode: contiguous caches [blocks, block_size, H_kv, D]");
    const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2);
    const at::Tensor table = block_table.to(at::kLong).contiguous();
    const at::Tensor lens = context_lens.to(at::kLong).contiguous();
    const bool writes = k_new.has_value() && k_new->defined();
    at::Tensor slots;
    if (writes) {
        TORCH_CHECK(v_new.has_value() && slot_mapping.has_value(), "paged_decode: k_new needs v_new and slot_mapping");
        TORCH_CHECK(k_new->scalar_type() == q.scalar_type() && v_new->scalar_type() == q.scalar_type() &&
                        k_new->stride(-1) == 1 && v_new->stride(-1) == 1,
                    "paged_decode: k_new, v_new [B, H_kv, D] in q's dtype, rows contiguous");
        slots = slot_mapping->to(at::kLong).contiguous();
    }
    at::Tensor out = at::empty({B, Hq, D}, q.options());
    const int status = rill_paged_decode(
        code, out.data_ptr(), q.data_ptr(), q.stride(0), q.stride(1), writes ? k_new->data_ptr() : nullptr,
        writes ? k_new->stride(0) : 0, writes ? k_new->stride(1) : 0, writes ? v_new->data_ptr() : nullptr,
        writes ? v_new->stride(0) : 0, writes ? v_new->stride(1) : 0, k_cache.data_ptr(), v_cache.data_ptr(),
        writes ? slots.data_ptr<int64_t>() : nullptr, table.data_ptr<int64_t>(), table.stride(0),
        lens.data_ptr<int64_t>(), B, Hq, k_cache.size(2), D, k_cache.size(1), 1.0f / std::sqrt(static_cast<float>(D)));
    TORCH_CHECK(status == 0, "paged_decode: query heads must be a multiple of the KV heads");
    return out;
}

// The step's new K/V [T, H_kv, D] (each head's row contiguous) into their slots of the caches
// [blocks, block_size, H_kv, D] (paged_decode.cpp's write_slots, which the decode kernel uses for
// its own rows). aten's index_copy_ took about 40 us a layer for a 512-token prompt.
void write_kv(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k, const at::Tensor& v,
              const at::Tensor& slot_mapping) {
    TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.dim() == 4 && k.dim() == 3 &&
                    k.sizes() == v.sizes() && k.size(1) == k_cache.size(2) && k.size(2) == k_cache.size(3) &&
                    k.scalar_type() == k_cache.scalar_type() && v.scalar_type() == v_cache.scalar_type() &&
                    k.stride(2) == 1 && v.stride(2) == 1 && slot_mapping.size(0) == k.size(0),
                "write_kv: contiguous caches [blocks, block_size, H_kv, D], k and v [T, H_kv, D] of their dtype with "
                "contiguous rows, a slot per token");
    const at::Tensor slots = slot_mapping.to(at::kLong).contiguous();
    const int64_t* s = slots.data_ptr<int64_t>();
    const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
    for (int64_t t = 0; t < k.size(0); ++t) TORCH_CHECK(s[t] >= 0 && s[t] < num_slots, "write_kv: a slot past the cache");
    rill_paged::write_slots(static_cast<char*>(k_cache.data_ptr()), static_cast<char*>(v_cache.data_ptr()),
                            static_cast<const char*>(k.data_ptr()), k.stride(0), k.stride(1),
                            static_cast<const char*>(v.data_ptr()), v.stride(0), v.stride(1), s, k.size(0), k.size(1),
                            k.size(2), k.element_size());
}

// The KV cache of each layer, set once by the engine (engine_proc/model/decode_graphs.py): the compiled
// decode graph names a layer instead of passing its cache, which torch.compile would otherwise
// treat as mutated and copy every step.
std::vector<std::pair<at::Tensor, at::Tensor>>& kv_caches() {
    static std::vector<std::pair<at::Tensor, at::Tensor>> caches;
    return caches;
}

void set_kv_caches(const std::vector<at::Tensor>& k, const std::vector<at::Tensor>& v) {
    TORCH_CHECK(k.size() == v.size(), "set_kv_caches: one V cache per K cache");
    auto& caches = kv_caches();
    caches.clear();
    for (size_t i = 0; i < k.size(); ++i) caches.emplace_back(k[i], v[i]);
}

at::Tensor paged_decode_layer(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& slot_mapping, const at::Tensor& block_table,
                              const at::Tensor& context_lens, int64_t layer) {
    auto& caches = kv_caches();
    TORCH_CHECK(layer >= 0 && layer < static_cast<int64_t>(caches.size()), "paged_decode_layer: no cache for layer ",
                layer);
    return paged_decode(q, caches[layer].first, caches[layer].second, block_table, context_lens, k, v, slot_mapping);
}

at::Tensor int8_gemv(const at::Tensor& x, const at::Tensor& weight_int8, const at::Tensor& scale, int64_t in_features) {
    const int code = dtype_code(x);
    TORCH_CHECK(code >= 0 && x.dim() == 2 && x.stride(1) == 1, "int8_gemv: x [M, K] float32 or bfloat16, rows contiguous");
    TORCH_CHECK(weight_int8.scalar_type() == at::kChar && weight_int8.is_contiguous() &&
                    scale.scalar_type() == at::kBFloat16 && scale.is_contiguous(),
                "int8_gemv: an int8 weight [N, Kp] and bfloat16 scales [N], contiguous");
    at::Tensor y = at::empty({x.size(0), weight_int8.size(0)}, x.options());
    const int status = rill_int8_gemv(code, y.data_ptr(), y.stride(0), x.data_ptr(), x.stride(0), x.size(0),
                                      in_features, weight_int8.data_ptr<int8_t>(), weight_int8.size(1),
                                      reinterpret_cast<const uint16_t*>(scale.data_ptr()), weight_int8.size(0));
    TORCH_CHECK(status == 0, "int8_gemv: the weight's row length must be a multiple of 16, at least in_features");
    return y;
}

// The converted weight's GEMM, a slice of output channels at a time, the scales on the output:
// engine_proc/model/quantization.py's dequantized_matmul, the same ATen calls.
at::Tensor dequantized_matmul(const at::Tensor& x, const at::Tensor& weight_int8, const at::Tensor& scale,
                              int64_t in_features) {
    const at::Tensor q = weight_int8.narrow(1, 0, in_features);
    const int64_t N = q.size(0), rows_per_chunk = std::max<int64_t>(1, kDequantChunkElems / in_features);
    at::Tensor y;
    if (N <= rows_per_chunk) {
        y = at::linear(x, q.to(x.scalar_type()));
    } else {
        y = at::empty({x.size(0), N}, x.options());
        for (int64_t start = 0; start < N; start += rows_per_chunk) {
            const int64_t n = std::min(rows_per_chunk, N - start);
            y.narrow(1, start, n).copy_(at::linear(x, q.narrow(0, start, n).to(x.scalar_type())));
        }
    }
    return y.mul_(scale.to(x.scalar_type()));
}

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& weight_int8, const at::Tensor& scale,
                       int64_t in_features) {
    if (x.size(0) <= kGemvMaxRows) return int8_gemv(x.stride(1) == 1 ? x : x.contiguous(), weight_int8, scale, in_features);
    return dequantized_matmul(x, weight_int8, scale, in_features);
}

// ---- elementwise.cpp: the eager step's norms, RoPE and SiLU, fused ----

void check_float(const at::Tensor& t, const char* what) {
    TORCH_CHECK(dtype_code(t) >= 0 && t.device().is_cpu(), what, ": a float32 or bfloat16 CPU tensor");
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
    check_float(x, "rms_norm");
    const int64_t n = x.size(-1);
    TORCH_CHECK(weight.scalar_type() == x.scalar_type() && weight.is_contiguous() && weight.numel() == n,
                "rms_norm: a contiguous weight [n] in x's dtype");
    const at::Tensor x2 = x.reshape({-1, n});
    TORCH_CHECK(x2.stride(1) == 1, "rms_norm: rows must be contiguous");
    at::Tensor y = at::empty(x.sizes(), x.options());
    if (x.scalar_type() == at::kFloat)
        rill_elementwise::rms_norm(y.data_ptr<float>(), x2.data_ptr<float>(), x2.stride(0), weight.data_ptr<float>(),
                                   x2.size(0), n, static_cast<float>(eps));
    else
        rill_elementwise::rms_norm(reinterpret_cast<uint16_t*>(y.data_ptr()),
                                   reinterpret_cast<const uint16_t*>(x2.data_ptr()), x2.stride(0),
                                   reinterpret_cast<const uint16_t*>(weight.data_ptr()), x2.size(0), n,
                                   static_cast<float>(eps));
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
    at::Tensor sum = at::empty(x.sizes(), x.options()), y = at::empty(x.sizes(), x.options());
    if (x.scalar_type() == at::kFloat)
        rill_elementwise::rms_norm(y.data_ptr<float>(), x2.data_ptr<float>(), n, weight.data_ptr<float>(), x2.size(0), n,
                                   static_cast<float>(eps), r2.data_ptr<float>(), sum.data_ptr<float>());
    else
        rill_elementwise::rms_norm(reinterpret_cast<uint16_t*>(y.data_ptr()), reinterpret_cast<const uint16_t*>(x2.data_ptr()),
                                   n, reinterpret_cast<const uint16_t*>(weight.data_ptr()), x2.size(0), n,
                                   static_cast<float>(eps), reinterpret_cast<const uint16_t*>(r2.data_ptr()),
                                   reinterpret_cast<uint16_t*>(sum.data_ptr()));
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
    if (x.scalar_type() == at::kFloat)
        rill_elementwise::rope(x.data_ptr<float>(), x.stride(0), x.stride(1), c.data_ptr<float>(), s.data_ptr<float>(),
                               c.stride(0), T, num_heads, D);
    else
        rill_elementwise::rope(reinterpret_cast<uint16_t*>(x.data_ptr()), x.stride(0), x.stride(1),
                               reinterpret_cast<const uint16_t*>(c.data_ptr()),
                               reinterpret_cast<const uint16_t*>(s.data_ptr()), c.stride(0), T, num_heads, D);
}

at::Tensor silu_mul(const at::Tensor& gate_up) {
    check_float(gate_up, "silu_mul");
    TORCH_CHECK(gate_up.dim() == 2 && gate_up.stride(1) == 1 && gate_up.size(1) % 2 == 0,
                "silu_mul: gate_up [T, 2n], rows contiguous");
    const int64_t T = gate_up.size(0), n = gate_up.size(1) / 2;
    at::Tensor y = at::empty({T, n}, gate_up.options());
    if (gate_up.scalar_type() == at::kFloat)
        rill_elementwise::silu_mul(y.data_ptr<float>(), gate_up.data_ptr<float>(), gate_up.stride(0), T, n);
    else
        rill_elementwise::silu_mul(reinterpret_cast<uint16_t*>(y.data_ptr()),
                                   reinterpret_cast<const uint16_t*>(gate_up.data_ptr()), gate_up.stride(0), T, n);
    return y;
}

}  // namespace

TORCH_LIBRARY(rill_cpu, m) {
    m.def("paged_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, Tensor context_lens, "
          "Tensor? k_new=None, Tensor? v_new=None, Tensor? slot_mapping=None) -> Tensor");
    m.def("set_kv_caches(Tensor[] k, Tensor[] v) -> ()");
    m.def("write_kv(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k, Tensor v, Tensor slot_mapping) -> ()");
    m.def("paged_decode_layer(Tensor q, Tensor k, Tensor v, Tensor slot_mapping, Tensor block_table, "
          "Tensor context_lens, int layer) -> Tensor");
    m.def("int8_gemv(Tensor x, Tensor weight_int8, Tensor scale, int in_features) -> Tensor");
    m.def("int8_linear(Tensor x, Tensor weight_int8, Tensor scale, int in_features) -> Tensor");
    m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
    m.def("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)");
    m.def("rope_(Tensor(a!) x, Tensor cos, Tensor sin, int num_heads) -> ()");
    m.def("silu_mul(Tensor gate_up) -> Tensor");
    m.def("prefill_attention_supported() -> bool");
    m.def("prefill_attention(Tensor q, Tensor k, Tensor v) -> Tensor");
    m.def("amx_linear_supported() -> bool");
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
    m.impl("paged_decode", &paged_decode);
    m.impl("paged_decode_layer", &paged_decode_layer);
    m.impl("write_kv", &write_kv);
    m.impl("int8_gemv", &int8_gemv);
    m.impl("int8_linear", &int8_linear);
    m.impl("rms_norm", &rms_norm);
    m.impl("add_rms_norm", &add_rms_norm);
    m.impl("rope_", &rope_);
    m.impl("silu_mul", &silu_mul);
    m.impl("prefill_attention", &prefill_attention);
    m.impl("amx_linear_pack", &amx_linear_pack);
    m.impl("amx_linear", &amx_linear);
    m.impl("amx_linear_silu_mul", &amx_linear_silu_mul);
    m.impl("amx_linear_rope", &amx_linear_rope);
    m.impl("prefill_layer", &prefill_layer);
}

TORCH_LIBRARY_IMPL(rill_cpu, CompositeExplicitAutograd, m) {
    m.impl("set_kv_caches", &set_kv_caches);
    m.impl("prefill_attention_supported", &prefill_attention_supported);
    m.impl("amx_linear_supported", &amx_linear_supported);
}
