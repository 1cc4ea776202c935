// The int8 KV cache (--kv-cache-dtype int8) in the CPU kernels (kv_int8.cpp): its writes, its decode
// attention and its dequantizing gather. A row (one token, one KV head) is D int8 values, then its
// float32 scale; engine_proc/attention/kv_int8.py is the torch twin and explains the layout.
#pragma once
#include <ATen/core/Tensor.h>

#include <optional>

namespace rill_cpu {

// paged_decode (paged_decode.h) over int8 caches [blocks, block_size, H_kv, D + 4]: q, k_new, v_new
// float32 or bfloat16; the new rows are quantized as they are written.
at::Tensor paged_decode_int8(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                             const at::Tensor& block_table, const at::Tensor& context_lens,
                             const std::optional<at::Tensor>& k_new, const std::optional<at::Tensor>& v_new,
                             const std::optional<at::Tensor>& slot_mapping, int64_t window, double softcap,
                             const std::optional<at::Tensor>& sinks);
// write_kv into int8 caches: k, v [T, H_kv, D] float32 or bfloat16, quantized row by row.
void write_kv_int8(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k, const at::Tensor& v,
                   const at::Tensor& slot_mapping);
// The first `length` rows of the blocks `block_table` [num_blocks] of an int8 cache, dequantized to
// [length, H_kv, D] in `like`'s dtype (a prompt chunk's cached context, for the prompt kernels).
at::Tensor kv_int8_gather(const at::Tensor& cache, const at::Tensor& block_table, int64_t length,
                          const at::Tensor& like);

}  // namespace rill_cpu
