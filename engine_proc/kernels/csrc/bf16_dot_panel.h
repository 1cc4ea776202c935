// Rill's own AVX-512 BF16 micro-kernel for amx_linear.cpp, where the tiles are not (Zen 4, Cooper Lake,
// or RILL_AMX_TILES=0): up to 32 rows of x times one packed 64-column panel with vdpbf16ps, the next
// weights prefetched over its k loop as amx_tiles.h does. Compiled where the build's target has
// AVX-512 BF16; RILL_BF16_DOT=0 keeps ATen's brgemm instead (to compare the two).
//
// Why not brgemm (oneDNN's AVX-512 BF16 micro-kernels) at decode's 8-32 rows: with weights streamed from
// memory it computes on a panel only once its loads have come in, and the memory idles meanwhile (a
// 32-row step of Qwen2.5-1.5B's shape on a 2-core Zen 4 ran its products at 155 GFLOP/s, where oneDNN
// reaches 400 at 256 rows and more). Here rows go six at a time against the panel's four 16-column
// vectors (24 accumulators in registers; the weights of each k pair loaded once per six rows, x's pair
// broadcast), over k in chunks of kChunk so that a chunk of the panel stays in L1 while every row block
// reads it, and the prefetches of what comes next spread over the multiplies.
//
// Bits: each output is one float32 accumulator over k pairs in ascending order, whatever the row count
// (vdpbf16ps, as oneDNN's AVX-512 kernels accumulate): batch invariant by construction.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define RILL_BF16_DOT 1

namespace rill_bf16_dot {

// Whether the kernel serves: RILL_BF16_DOT, read once; amx_linear_kernel(use) switches it in a running process,
// so that a benchmark compares the two kernels in one (bench.kernels.linear_kernels' brgemm column).
inline std::atomic<bool>& enabled() {
    static std::atomic<bool> on{[] {
        const char* env = std::getenv("RILL_BF16_DOT");
        return !(env && env[0] == '0');
    }()};
    return on;
}

inline bool available() { return enabled().load(std::memory_order_relaxed); }

constexpr int64_t kChunk = 128;  // k per chunk: 16 KB of a 64-column panel
constexpr int kBlockRows = 6;    // rows per block: 6 x 4 accumulators, 4 weight vectors, 1 broadcast

// Spreads `lines` prefetches (64 bytes each, from pf, towards L2) evenly over `steps` calls of step().
struct Prefetcher {
    const char* pf;
    int64_t lines, steps, done = 0, issued = 0;
    inline void step() {
        const int64_t due = ++done * lines / steps;
        for (; issued < due; ++issued) _mm_prefetch(pf + issued * 64, _MM_HINT_T1);
    }
};

// c[r][64] (+)= rows [0, R) of x (rows lda apart) times the panel's k pairs [p0, p1).
template <int R>
inline void block(const uint16_t* x, int64_t lda, const uint16_t* panel, int64_t p0, int64_t p1, float* c,
                  bool load_c, Prefetcher& pf) {
    __m512 acc[R][4];
    for (int r = 0; r < R; ++r)
        for (int q = 0; q < 4; ++q) acc[r][q] = load_c ? _mm512_loadu_ps(c + r * 64 + q * 16) : _mm512_setzero_ps();
    for (int64_t p = p0; p < p1; ++p) {
        const uint16_t* b = panel + p * 128;  // k pair p of the 64 columns: (k, k + 1) per 32-bit lane
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b), b1 = (__m512bh)_mm512_loadu_si512(b + 32),
                       b2 = (__m512bh)_mm512_loadu_si512(b + 64), b3 = (__m512bh)_mm512_loadu_si512(b + 96);
        for (int r = 0; r < R; ++r) {
            int32_t pair;
            std::memcpy(&pair, x + r * lda + 2 * p, 4);
            const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, b0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, b1);
            acc[r][2] = _mm512_dpbf16_ps(acc[r][2], a, b2);
            acc[r][3] = _mm512_dpbf16_ps(acc[r][3], a, b3);
        }
        pf.step();
    }
    for (int r = 0; r < R; ++r)
        for (int q = 0; q < 4; ++q) _mm512_storeu_ps(c + r * 64 + q * 16, acc[r][q]);
}

template <int R>
inline void block_of(int rows, const uint16_t* x, int64_t lda, const uint16_t* panel, int64_t p0, int64_t p1, float* c,
                     bool load_c, Prefetcher& pf) {
    if constexpr (R > 1) {
        if (rows < R) return block_of<R - 1>(rows, x, lda, panel, p0, p1, c, load_c, pf);
    }
    block<R>(x, lda, panel, p0, p1, c, load_c, pf);
}

// c [rows][64] floats = x [rows, k_len] (rows lda apart, k_len even) times the packed panel rows w (element
// (k, j) at (k / 2) * 128 + j * 2 + k % 2), plus c itself with `accumulate`. The pf_bytes from pf (or none)
// are prefetched over the call. amx_tiles.h's Tiles::panel, in AVX-512.
inline void panel(const uint16_t* x, int64_t rows, int64_t lda, int64_t k_len, const uint16_t* w, float* c,
                  bool accumulate, const char* pf, int64_t pf_bytes) {
    const int64_t pairs = k_len / 2, blocks = (rows + kBlockRows - 1) / kBlockRows;
    Prefetcher prefetcher{pf, pf ? pf_bytes / 64 : 0, blocks * pairs};
    for (int64_t p0 = 0; p0 < pairs; p0 += kChunk / 2) {
        const int64_t p1 = p0 + kChunk / 2 < pairs ? p0 + kChunk / 2 : pairs;
        for (int64_t r0 = 0; r0 < rows; r0 += kBlockRows) {
            const int n = int(rows - r0 < kBlockRows ? rows - r0 : kBlockRows);
            block_of<kBlockRows>(n, x + r0 * lda, lda, w, p0, p1, c + r0 * 64, accumulate || p0 > 0, prefetcher);
        }
    }
}

}  // namespace rill_bf16_dot
#endif
