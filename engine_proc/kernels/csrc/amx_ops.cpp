// The torch operators over AMX micro-kernels (ops.cpp includes this file and registers them):
// a prompt chunk's causal attention (prefill_attention.cpp) and bfloat16 linear layers over
// weights packed once (amx_linear.cpp). Callers check the *_supported() operators first.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <cmath>
#include <optional>

#include "amx_linear.cpp"
#include "prefill_attention.cpp"

namespace {

// ---- prefill_attention.cpp: a prompt chunk's causal attention through AMX micro-kernels ----

bool prefill_attention_supported() { return rill_prefill::supported(); }

at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    TORCH_CHECK(rill_prefill::supported(), "prefill_attention: this CPU has neither AMX-BF16 nor AVX-512 BF16 (see prefill_attention_supported)");
    TORCH_CHECK(q.scalar_type() == at::kBFloat16 && k.scalar_type() == at::kBFloat16 && v.scalar_type() == at::kBFloat16,
                "prefill_attention: bfloat16 q, k and v");
    TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3 && q.stride(2) == 1 && k.stride(2) == 1 &&
                    v.stride(2) == 1 && k.sizes() == v.sizes(),
                "prefill_attention: q [Tq, H, D], k and v [Tk, H_kv, D], rows contiguous");
    const int64_t Tq = q.size(0), H = q.size(1), D = q.size(2), Tk = k.size(0), KV = k.size(1);
    TORCH_CHECK(k.size(2) == D && H % KV == 0 && Tk >= Tq && D % 64 == 0,
                "prefill_attention: query heads a multiple of the KV heads, at least as many keys as queries, a head "
                "dimension that is a multiple of 64");
    at::Tensor out = at::empty({Tq, H, D}, q.options());
    rill_prefill::attention(reinterpret_cast<uint16_t*>(out.data_ptr()), reinterpret_cast<const uint16_t*>(q.data_ptr()),
                            q.stride(0), q.stride(1), reinterpret_cast<const uint16_t*>(k.data_ptr()), k.stride(0), k.stride(1),
                            reinterpret_cast<const uint16_t*>(v.data_ptr()), v.stride(0), v.stride(1), Tq, Tk, H, KV, D,
                            1.0f / std::sqrt(static_cast<float>(D)));
    return out;
}

// ---- amx_linear.cpp: bfloat16 linear layers through AMX micro-kernels, weights packed once ----

bool amx_linear_supported() { return rill_amx_linear::supported(); }

at::Tensor amx_linear_pack(const at::Tensor& weight) {
    TORCH_CHECK(rill_amx_linear::supported(), "amx_linear_pack: this CPU has neither AMX-BF16 nor AVX-512 BF16");
    TORCH_CHECK(weight.scalar_type() == at::kBFloat16 && weight.dim() == 2 && weight.size(1) % 2 == 0,
                "amx_linear_pack: a bfloat16 weight [out, in] with an even number of inputs");
    const at::Tensor w = weight.contiguous();
    const int64_t N = w.size(0), K = w.size(1);
    at::Tensor out = at::empty({rill_amx_linear::num_panels(N), K * rill_amx_linear::kPanel}, w.options());
    rill_amx_linear::pack(reinterpret_cast<uint16_t*>(out.data_ptr()), reinterpret_cast<const uint16_t*>(w.data_ptr()),
                          N, K);
    return out;
}

// x [rows, in] times a weight from amx_linear_pack (plus bias): [rows, out_features], or with
// silu_mul silu(gate) * up of it, [rows, out_features / 2] (gate the first half of the outputs).
at::Tensor amx_linear_impl(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias,
                           int64_t out_features, bool fixed_tiles, bool silu_mul,
                           const rill_amx_linear::Rope* rope = nullptr) {
    TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2 && packed.scalar_type() == at::kBFloat16,
                "amx_linear: bfloat16 x [rows, in] and a weight from amx_linear_pack");
    const int64_t M = x.size(0), K = x.size(1);
    TORCH_CHECK(packed.size(0) == rill_amx_linear::num_panels(out_features) &&
                    packed.size(1) == K * rill_amx_linear::kPanel,
                "amx_linear: the packed weight is not [ceil(out / 64), in * 64] for this x");
    TORCH_CHECK(!silu_mul || out_features % (2 * rill_amx_linear::kPanel) == 0,
                "amx_linear_silu_mul: out_features must be a multiple of 128 (gate and up of 64-column panels)");
    at::Tensor out = at::empty({M, silu_mul ? out_features / 2 : out_features}, x.options());
    if (M == 0) return out;
    const at::Tensor xc = x.contiguous();
    at::Tensor b;
    if (bias.has_value()) b = bias->to(at::kFloat).contiguous();
    rill_amx_linear::linear(reinterpret_cast<uint16_t*>(out.data_ptr()), reinterpret_cast<const uint16_t*>(xc.data_ptr()),
                            reinterpret_cast<const uint16_t*>(packed.data_ptr()),
                            b.defined() ? b.data_ptr<float>() : nullptr, M, out_features, K, fixed_tiles, silu_mul, rope);
    return out;
}

at::Tensor amx_linear(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias,
                      int64_t out_features, bool fixed_tiles) {
    return amx_linear_impl(x, packed, bias, out_features, fixed_tiles, false);
}

// The layer with its first rope_cols outputs (heads of 64: q's and k's) rotated by RoPE, cos and sin
// [rows, 1, 32] in bfloat16 as rope_ takes them: the bits of amx_linear, then rope_ on those heads.
at::Tensor amx_linear_rope(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias,
                           int64_t out_features, bool fixed_tiles, const at::Tensor& cos, const at::Tensor& sin,
                           int64_t rope_cols) {
    const int64_t M = x.size(0), half = rill_amx_linear::kPanel / 2;
    TORCH_CHECK(cos.scalar_type() == at::kBFloat16 && sin.scalar_type() == at::kBFloat16 && cos.numel() == M * half &&
                    sin.numel() == M * half && rope_cols % rill_amx_linear::kPanel == 0 && rope_cols <= out_features,
                "amx_linear_rope: bfloat16 cos and sin [rows, 1, 32] (heads of 64), rope_cols whole heads of the outputs");
    const at::Tensor c = cos.reshape({M, half}).contiguous(), s = sin.reshape({M, half}).contiguous();
    const rill_amx_linear::Rope rope{reinterpret_cast<const uint16_t*>(c.data_ptr()),
                                     reinterpret_cast<const uint16_t*>(s.data_ptr()), half, rope_cols};
    return amx_linear_impl(x, packed, bias, out_features, fixed_tiles, false, &rope);
}

at::Tensor amx_linear_silu_mul(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias,
                               int64_t out_features, bool fixed_tiles) {
    return amx_linear_impl(x, packed, bias, out_features, fixed_tiles, true);
}

}  // namespace
