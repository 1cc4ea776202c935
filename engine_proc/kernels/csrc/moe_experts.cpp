// The experts of a mixture-of-experts layer in one operator, for the transformers route's layers
// (engine_proc/model/hf_experts.py): Mixtral's and Qwen3-MoE's SiLU gate, GPT-OSS's clamped SwiGLU.
// The arithmetic of the Python loop it replaces: the step's (token, expert) pairs sorted by expert,
// the gate-and-up GEMM (its gate in the epilogue for SiLU, a float32 pass after it for GPT-OSS's)
// and the down GEMM per expert over all of its tokens, each output row times its weight in float32,
// and each token's k rows summed in its top-k order, rounded once. What it saves is the loop's
// Python: about 0.45 ms a layer at 16 tokens and 8 experts (Zen 4). moe_experts_int8: the same over
// --quantization int8's weights (int8_linear per projection).
#include "moe_experts.h"

#include "amx_linear.h"
#include "elementwise.h"
#include "float_bits.h"
#include "int8_gemv.h"

namespace {

// GPT-OSS's gate over gate_up [n, 2I] (gate and up interleaved) into out [n, I], in float32.
void clamped_swiglu(const at::Tensor& gate_up, at::Tensor& out, float alpha, float limit) {
    const int64_t n = gate_up.size(0), I = out.size(1);
    const uint16_t* in = static_cast<const uint16_t*>(gate_up.data_ptr());
    uint16_t* o = static_cast<uint16_t*>(out.data_ptr());
    for (int64_t r = 0; r < n; ++r) {
#pragma omp simd
        for (int64_t j = 0; j < I; ++j) {
            float g = rill_float::to_float(in[r * 2 * I + 2 * j]), u = rill_float::to_float(in[r * 2 * I + 2 * j + 1]);
            g = g < limit ? g : limit;
            u = u < -limit ? -limit : (u > limit ? limit : u);
            rill_float::store(o + r * I + j, (u + 1.0f) * g / (1.0f + rill_float::exp_clamped(-alpha * g)));
        }
    }
}

std::optional<at::Tensor> at_index(const c10::List<std::optional<at::Tensor>>& list, int64_t i) {
    return list.size() == 0 ? std::nullopt : static_cast<std::optional<at::Tensor>>(list.get(i));
}

// The shared loop: the step's (token, expert) pairs sorted by expert; `expert(e, rows)` gives expert
// e's output [n, hidden] for its tokens' rows; each row times its weight in float32, and each token's
// k rows summed in its top-k order, rounded once.
template <typename Expert>
at::Tensor run_experts(const at::Tensor& x, const at::Tensor& top_k_index, const at::Tensor& top_k_weights,
                       int64_t num_experts, int64_t hidden, Expert&& expert) {
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && top_k_index.dim() == 2 &&
                    top_k_index.size(0) == x.size(0) && top_k_weights.sizes() == top_k_index.sizes(),
                "moe_experts: x [T, H] bfloat16, top_k_index and top_k_weights [T, k]");
    const int64_t T = x.size(0), k = top_k_index.size(1), E = num_experts;
    const at::Tensor ids = top_k_index.to(at::kLong).contiguous();
    const at::Tensor weights = top_k_weights.to(at::kFloat).contiguous();
    const int64_t* id = ids.data_ptr<int64_t>();
    // The pairs (token * k + slot) of each expert, in token order.
    std::vector<std::vector<int64_t>> pairs(E);
    for (int64_t p = 0; p < T * k; ++p) {
        TORCH_CHECK(id[p] >= 0 && id[p] < E, "moe_experts: an expert index past the experts");
        pairs[id[p]].push_back(p);
    }
    at::Tensor weighted = x.new_empty({T * k, hidden}, x.options().dtype(at::kFloat));  // each pair's row
    const float* w = weights.data_ptr<float>();
    for (int64_t e = 0; e < E; ++e) {
        const int64_t n = static_cast<int64_t>(pairs[e].size());
        if (n == 0) continue;
        at::Tensor pair_ids = ids.new_empty({n});
        int64_t* pi = pair_ids.data_ptr<int64_t>();
        for (int64_t j = 0; j < n; ++j) pi[j] = pairs[e][j] / k;  // the pair's token
        const at::Tensor out = expert(e, x.index_select(0, pair_ids)).contiguous();
        TORCH_CHECK(out.scalar_type() == at::kBFloat16 && out.size(1) == hidden, "moe_experts: an expert's output");
        const uint16_t* o = static_cast<const uint16_t*>(out.data_ptr());
        float* dst = weighted.data_ptr<float>();
        for (int64_t j = 0; j < n; ++j) {
            const int64_t p = pairs[e][j];
            const float scale = w[p];
            float* d = dst + p * hidden;
            const uint16_t* s = o + j * hidden;
#pragma omp simd
            for (int64_t c = 0; c < hidden; ++c) d[c] = rill_float::to_float(s[c]) * scale;
        }
    }
    at::Tensor y = x.new_empty({T, hidden});
    const float* src = weighted.data_ptr<float>();
    uint16_t* yo = static_cast<uint16_t*>(y.data_ptr());
    for (int64_t t = 0; t < T; ++t) {
        for (int64_t c = 0; c < hidden; ++c) {
            float sum = src[(t * k) * hidden + c];
            for (int64_t slot = 1; slot < k; ++slot) sum += src[(t * k + slot) * hidden + c];
            rill_float::store(yo + t * hidden + c, sum);
        }
    }
    return y;
}

bool is_silu(std::string_view gate) {
    TORCH_CHECK(gate == "silu" || gate == "clamped_swiglu", "moe_experts: gate 'silu' or 'clamped_swiglu'");
    return gate == "silu";
}

at::Tensor with_bias(at::Tensor y, const std::optional<at::Tensor>& bias) {
    return bias.has_value() ? y.add_(*bias) : y;
}

}  // namespace

namespace rill_cpu {

at::Tensor moe_experts(const at::Tensor& x, const at::Tensor& top_k_index, const at::Tensor& top_k_weights,
                       at::TensorList gate_up, const c10::List<std::optional<at::Tensor>>& gate_up_bias,
                       at::TensorList down, const c10::List<std::optional<at::Tensor>>& down_bias,
                       int64_t intermediate, int64_t hidden, std::string_view gate, double alpha, double limit) {
    TORCH_CHECK(gate_up.size() == down.size() && (gate_up_bias.size() == 0 || gate_up_bias.size() == gate_up.size()) &&
                    (down_bias.size() == 0 || down_bias.size() == down.size()),
                "moe_experts: one down per gate_up, a bias per expert or none");
    const bool silu = is_silu(gate);
    return run_experts(x, top_k_index, top_k_weights, static_cast<int64_t>(gate_up.size()), hidden,
                       [&](int64_t e, const at::Tensor& rows) {
        at::Tensor gated;
        if (silu) {
            gated = amx_linear_silu_mul(rows, gate_up[e], at_index(gate_up_bias, e), 2 * intermediate, false);
        } else {
            gated = rows.new_empty({rows.size(0), intermediate});
            clamped_swiglu(amx_linear(rows, gate_up[e], at_index(gate_up_bias, e), 2 * intermediate, false), gated,
                           static_cast<float>(alpha), static_cast<float>(limit));
        }
        return amx_linear(gated, down[e], at_index(down_bias, e), hidden, false);
    });
}

at::Tensor moe_experts_int8(const at::Tensor& x, const at::Tensor& top_k_index, const at::Tensor& top_k_weights,
                            at::TensorList gate_up, at::TensorList gate_up_scale,
                            const c10::List<std::optional<at::Tensor>>& gate_up_bias, at::TensorList down,
                            at::TensorList down_scale, const c10::List<std::optional<at::Tensor>>& down_bias,
                            int64_t intermediate, int64_t hidden, std::string_view gate, double alpha, double limit,
                            int64_t gemv_max_rows, int64_t chunk_elems) {
    const size_t E = gate_up.size();
    TORCH_CHECK(down.size() == E && gate_up_scale.size() == E && down_scale.size() == E &&
                    (gate_up_bias.size() == 0 || gate_up_bias.size() == E) && (down_bias.size() == 0 || down_bias.size() == E),
                "moe_experts_int8: per expert a weight and a scale of each projection, a bias or none");
    const bool silu = is_silu(gate);
    const int64_t in_features = x.size(1);
    return run_experts(x, top_k_index, top_k_weights, static_cast<int64_t>(E), hidden,
                       [&](int64_t e, const at::Tensor& rows) {
        at::Tensor gate_up_out = with_bias(
            int8_linear(rows, gate_up[e], gate_up_scale[e], in_features, gemv_max_rows, chunk_elems),
            at_index(gate_up_bias, e));
        at::Tensor gated;
        if (silu) {
            gated = silu_mul(gate_up_out);
        } else {
            gated = rows.new_empty({rows.size(0), intermediate});
            clamped_swiglu(gate_up_out.contiguous(), gated, static_cast<float>(alpha), static_cast<float>(limit));
        }
        return with_bias(int8_linear(gated, down[e], down_scale[e], intermediate, gemv_max_rows, chunk_elems),
                         at_index(down_bias, e));
    });
}

}  // namespace rill_cpu
