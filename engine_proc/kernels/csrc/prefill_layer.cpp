// One decoder layer of a prompt step as one operator: the norms, the AMX projections with their
// fused RoPE and SiLU epilogues, the K/V writes and the prompt attention, called here one after
// the other instead of from Python. Measured on a 2-core Sapphire Rapids, a 512-token prefill spent
// about 5 ms of its ~90 between those calls (the interpreter and the operator dispatch, their code
// and data cold after each kernel), while the second core waited at the next parallel region.
//
// The bits are those of the Python layer (engine_proc/model/llama.py) on the same path: the same
// functions run in the same order. engine_proc/kernels/prefill_layer.py says when it applies: a
// Llama-family layer with AmxLinear projections, heads of 64, no per-head norms, a step of fresh
// prompts only (each attends to its own tokens), no LoRA, one rank.
#include "prefill_layer.h"

#include "amx_linear.h"
#include "elementwise.h"
#include "paged_decode.h"
#include "prefill_attention.h"

namespace rill_cpu {

// (the layer's MLP output, the residual stream before it), as DecoderLayer.forward returns them.
// weights: input norm, qkv_proj, o_proj, post-attention norm, gate_up_proj, down_proj (the four
// projections packed by amx_linear_pack); biases and out_features: the four projections'.
// bounds: the prompts' first token rows, then the step's token count. rows: past the K/V writes,
// only these tokens go on (the last layer: the rows the head reads).
std::tuple<at::Tensor, at::Tensor> prefill_layer(const at::Tensor& h, const std::optional<at::Tensor>& residual,
                                                 at::TensorList weights, const c10::List<std::optional<at::Tensor>>& biases,
                                                 at::IntArrayRef out_features, double eps, const at::Tensor& cos,
                                                 const at::Tensor& sin, int64_t num_heads, int64_t num_kv_heads,
                                                 const at::Tensor& k_cache, const at::Tensor& v_cache,
                                                 const at::Tensor& slot_mapping, at::IntArrayRef bounds,
                                                 const std::optional<at::Tensor>& rows) {
    TORCH_CHECK(weights.size() == 6 && biases.size() == 4 && out_features.size() == 4,
                "prefill_layer: 6 weights (2 norms, 4 packed projections), 4 biases and 4 output widths");
    TORCH_CHECK(bounds.size() >= 2 && bounds.front() == 0 && bounds.back() == h.size(0),
                "prefill_layer: bounds from 0 to the step's token count");
    constexpr int64_t D = 64;
    const int64_t T = h.size(0), heads = num_heads + 2 * num_kv_heads;
    TORCH_CHECK(out_features[0] == heads * D, "prefill_layer: qkv_proj's outputs are not heads of 64");
    auto [res, x] = residual.has_value() ? add_rms_norm(h, *residual, weights[0], eps)
                                         : std::make_tuple(h, rms_norm(h, weights[0], eps));
    const at::Tensor qkv = amx_linear_rope(x, weights[1], biases.get(0), out_features[0], false, cos, sin,
                                           (num_heads + num_kv_heads) * D)
                               .view({T, heads, D});
    const at::Tensor q = qkv.narrow(1, 0, num_heads), k = qkv.narrow(1, num_heads, num_kv_heads),
                     v = qkv.narrow(1, num_heads + num_kv_heads, num_kv_heads);
    write_kv(k_cache, v_cache, k, v, slot_mapping);
    at::Tensor o;
    if (bounds.size() == 2) {  // one prompt: its attention is the whole output
        o = prefill_attention(q, k, v);
    } else {
        o = q.new_empty({T, num_heads, D});
        for (size_t i = 0; i + 1 < bounds.size(); ++i) {
            const int64_t s = bounds[i], n = bounds[i + 1] - s;
            o.narrow(0, s, n).copy_(prefill_attention(q.narrow(0, s, n), k.narrow(0, s, n), v.narrow(0, s, n)));
        }
    }
    o = o.view({T, num_heads * D});
    if (rows.has_value()) {
        o = o.index_select(0, *rows);
        res = res.index_select(0, *rows);
    }
    const at::Tensor a = amx_linear(o, weights[2], biases.get(1), out_features[1], false);
    std::tie(res, x) = add_rms_norm(a, res, weights[3], eps);
    const at::Tensor act = amx_linear_silu_mul(x, weights[4], biases.get(2), out_features[2], false);
    return {amx_linear(act, weights[5], biases.get(3), out_features[3], false), res};
}

}  // namespace rill_cpu
