// Paged decode attention and the KV writes (paged_decode.cpp): the operators rill_cpu::paged_decode,
// write_kv, set_kv_caches and paged_decode_layer, whose schemas bindings.cpp registers.
#pragma once
#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

namespace rill_cpu {

// One query token per row, q [B, H, D], over keys 0..context_lens[b]-1 of row b, whose blocks are
// block_table[b] in k_cache/v_cache [blocks, block_size, H_kv, D]; with k_new/v_new [B, H_kv, D]
// and slot_mapping [B] it first writes them into the caches. window > 0: only the last `window`
// keys; softcap > 0: scores soft-capped; sinks [H]: a logit per head in each softmax's denominator.
at::Tensor paged_decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                        const at::Tensor& block_table, const at::Tensor& context_lens,
                        const std::optional<at::Tensor>& k_new, const std::optional<at::Tensor>& v_new,
                        const std::optional<at::Tensor>& slot_mapping, int64_t window, double softcap,
                        const std::optional<at::Tensor>& sinks);
void write_kv(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k, const at::Tensor& v,
              const at::Tensor& slot_mapping);
void set_kv_caches(const std::vector<at::Tensor>& k, const std::vector<at::Tensor>& v);
// paged_decode on layer `layer`'s caches from set_kv_caches, writing k and v first.
at::Tensor paged_decode_layer(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& slot_mapping, const at::Tensor& block_table,
                              const at::Tensor& context_lens, int64_t layer, int64_t window, double softcap,
                              const std::optional<at::Tensor>& sinks);

}  // namespace rill_cpu
