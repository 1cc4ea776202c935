// Uninitialised scratch buffers on a 64-byte boundary, for what AMX tiles load and store: measured
// with brgemm on a Sapphire Rapids, tile loads from buffers on new[]'s 16-byte boundary took 2-4x
// as long (prefill_attention.cpp's score and probability rows, amx_linear.cpp's padded tile).
#pragma once
#include <cstdint>
#include <cstdlib>
#include <memory>

namespace rill_mem {

struct Free {
    void operator()(void* p) const { std::free(p); }
};

template <typename T>
using Buffer = std::unique_ptr<T[], Free>;

template <typename T>
Buffer<T> buffer(int64_t n) {
    const int64_t bytes = (n * static_cast<int64_t>(sizeof(T)) + 63) / 64 * 64;
    return Buffer<T>(static_cast<T*>(std::aligned_alloc(64, bytes > 0 ? bytes : 64)));
}

}  // namespace rill_mem
