// A bfloat16 linear layer through AMX micro-kernels: ATen's brgemm (oneDNN's ukernels, float32
// accumulation) over weights packed once, at load, into panels of 64 output columns.
//
// Measured on a 2-core Sapphire Rapids against oneDNN's inner product over its own prepacked
// weights (what loader.PackedLinear calls), one call with cold weights (python -m
// bench.kernels.linear_kernels): at 1 to 32 rows (decode) 0.76-0.99x its time, oneDNN's per-call overhead
// weighing on a small layer; at 512 rows (prefill) 0.70x where the layer has 576 outputs, for
// which oneDNN's inner product picks a poor blocking, 1.03x at 960, 1.36x at 3,072 (gate_up_proj,
// which takes it anyway for its SiLU epilogue: see loader.AMX_DEFAULT_LAYERS).
//
// With `fixed_tiles` (--batch-invariant), every brgemm call has the same shape: fixed_tile() rows (a last
// partial tile is copied into a zero-padded buffer), one panel, the whole reduction. So a row's
// result never depends on how many other rows share the call, nor on its place among them: the
// layer is batch invariant by construction (no row tiling around it). Without, a partial tile is
// a call of its own rows: the copy cost a decode step at batch 1 about 1 ms of 17. (AMX computes
// each row alone in the same order whatever the row count, so on the CPUs tested the bits are
// the same either way; the padding makes it hold by construction.)
//
// The operators rill_cpu::amx_linear_pack, amx_linear, amx_linear_silu_mul and amx_linear_rope
// (bindings.cpp registers them); callers check amx_linear_supported() (prefill_attention.cpp's
// check too).
#include "amx_linear.h"

#include <ATen/native/CPUBlas.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "aligned.h"
#include "amx_tiles.h"
#include "bf16_dot_panel.h"
#include "bf16_simd.h"
#include "float_bits.h"
#include "simd16.h"
#ifdef _OPENMP
#include <omp.h>
#endif

namespace rill_amx_linear {
namespace {

// Rows per brgemm call. Measured per layer at 512 rows: 16 rows 20-50% slower than 32 or 64,
// which were within a few percent of each other; 32 pads a fixed_tiles decode step less.
constexpr int64_t kTile = 32;
// With amx_tiles.h's kernel, a decode step's calls prefetch the weights this many bytes ahead of the panel
// they read (within the thread's own panels): 128 KB and 196 KB (a 1,536-input panel) came out alike.
constexpr int64_t kPrefetchAhead = 128 * 1024;
// A prompt's rows a thread keeps in L2 across panels, at most; past it amx_tiles.h's kernel takes K in
// chunks, over groups of this many units at a time (their sums kept between chunks: 512 KB at 256 rows).
constexpr int64_t kChunkedRowBytes = 1 << 20;
constexpr int64_t kChunkGroup = 8;
constexpr int64_t kRowBlock = 512;
// Past kDotMaxRows rows of at most kDotShortK inputs, ATen's brgemm rather than bf16_dot_panel.h's micro-kernel (the
// two give the same bits): on a 2-core Zen 4 at Qwen2.5-1.5B's shape (1,536 inputs) brgemm took 0.86-0.99x its time
// on qkv_proj, o_proj and gate_up_proj at 64 to 512 rows, the micro-kernel 0.75-1.00x brgemm's at 1 to 32, and on
// down_proj's 8,960 inputs 0.38-0.47x at every row count (bench/results/linear_kernels-qwen2.5-1.5b-amd-zen4.md).
constexpr int64_t kDotMaxRows = 32;
constexpr int64_t kDotShortK = 2048;
// Rows per call with fixed_tiles, chosen once per CPU. With AMX one tile's height, 16: a decode
// step's rows are padded to it, so the padded rows cost half what 32 did (the LM head's most of
// all): a --batch-invariant decode step at batch 1 took 17.1 against 20.9 ms, at 8 20.3 against
// 23.9; a 512-token prefill 159 against 157 ms (python -m bench.kernels.engine_step --dtype bfloat16). With
// AVX-512 BF16 alone each padded row costs its full arithmetic (16 rows of the bundled model are
// about 4 GFLOP a step, 12 ms on a 2-core Zen 4), so fewer: RILL_FIXED_TILE_ROWS overrides.
int64_t fixed_tile() {
    static const int64_t rows = [] {
        if (const char* env = std::getenv("RILL_FIXED_TILE_ROWS")) return std::clamp<int64_t>(std::atoll(env), 1, kTile);
        return at::native::cpublas::could_pack(at::kBFloat16) ? int64_t{16} : int64_t{4};
    }();
    return rows;
}

// w [N, K] (bfloat16 bits, rows contiguous) into out [num_panels(N), K * 64]: panel p holds
// columns p*64.. as brgemm reads them, columns past N zero. K must be even. Written here rather
// than by cpublas::pack, which packs only where AMX is: the pairs of K of each column, element
// (k, j) of the panel at (k / 2) * 128 + j * 2 + k % 2, the layout both AMX and AVX-512 BF16 read.
void pack(uint16_t* out, const uint16_t* w, int64_t N, int64_t K) {
    const int64_t P = num_panels(N);
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < P; ++p) {
        uint16_t* panel = out + p * K * kPanel;
        for (int64_t j = 0; j < kPanel; ++j) {
            const int64_t n = p * kPanel + j;
            for (int64_t k = 0; k < K; ++k) panel[(k / 2) * 2 * kPanel + j * 2 + k % 2] = n < N ? w[n * K + k] : 0;
        }
    }
}

// The epilogue of one tile: `rows` rows of 64 float32 columns (c; c2 too for silu_mul) to
// bfloat16 outputs at dst (rows `ld` apart), bias (or null) added first.
inline void store_tile(uint16_t* dst, int64_t ld, const float* c, const float* bias, int64_t rows, int64_t cols) {
#ifdef RILL_BF16_SIMD
    if (cols == kPanel) {  // (GCC's vectorisation of the rounding below took about 20% of a layer)
        for (int64_t i = 0; i < rows; ++i)
            for (int64_t j = 0; j < kPanel; j += 16) {
                __m512 v = _mm512_loadu_ps(c + i * kPanel + j);
                if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + j));
                rill_simd::store_bf16(dst + i * ld + j, v);
            }
        return;
    }
#endif
    for (int64_t i = 0; i < rows; ++i) {
        const float* cr = c + i * kPanel;
        uint16_t* d = dst + i * ld;
        if (bias) {
#pragma omp simd
            for (int64_t j = 0; j < cols; ++j) rill_float::store(d + j, cr[j] + bias[j]);
        } else {
#pragma omp simd
            for (int64_t j = 0; j < cols; ++j) rill_float::store(d + j, cr[j]);
        }
    }
}

inline void store_rope_tile(uint16_t* dst, int64_t ld, const float* c, const float* bias, int64_t rows,
                            const uint16_t* cos, const uint16_t* sin, int64_t cs_stride) {
    constexpr int64_t half = kPanel / 2;
    for (int64_t i = 0; i < rows; ++i) {
        const float* cr = c + i * kPanel;
        const uint16_t *cs = cos + i * cs_stride, *sn = sin + i * cs_stride;
#ifdef RILL_BF16_SIMD
        for (int64_t j = 0; j < half; j += 16) {
            __m512 x1 = _mm512_loadu_ps(cr + j), x2 = _mm512_loadu_ps(cr + half + j), y1, y2;
            if (bias) {
                x1 = _mm512_add_ps(x1, _mm512_loadu_ps(bias + j));
                x2 = _mm512_add_ps(x2, _mm512_loadu_ps(bias + half + j));
            }
            rill_simd::rope16(rill_simd::round_bf16(x1), rill_simd::round_bf16(x2), rill_simd::load_bf16(cs + j),
                              rill_simd::load_bf16(sn + j), y1, y2);
            rill_simd::store_bf16(dst + i * ld + j, y1);
            rill_simd::store_bf16(dst + i * ld + half + j, y2);
        }
#else  // an AMX CPU running a build for an older one (the AVX2 and SSE2 test builds)
        for (int64_t j = 0; j < half; ++j) {
            uint16_t b1, b2;
            float y1, y2;
            rill_float::store(&b1, cr[j] + (bias ? bias[j] : 0.0f));
            rill_float::store(&b2, cr[half + j] + (bias ? bias[half + j] : 0.0f));
            rill_float::rope(rill_float::to_float(b1), rill_float::to_float(b2), rill_float::to_float(cs[j]),
                             rill_float::to_float(sn[j]), y1, y2);
            rill_float::store(dst + i * ld + j, y1);
            rill_float::store(dst + i * ld + half + j, y2);
        }
#endif
    }
}

// silu(gate) * up of a tile, each rounded to bfloat16 first (the bits of the layer's output fed
// to elementwise.cpp's silu_mul); gate_bias and up_bias may be null.
inline void store_silu_tile(uint16_t* dst, int64_t ld, const float* cg, const float* cu, const float* gate_bias,
                            const float* up_bias, int64_t rows) {
    for (int64_t i = 0; i < rows; ++i) {
#ifdef RILL_BF16_SIMD
        for (int64_t j = 0; j < kPanel; j += 16) {
            __m512 g = _mm512_loadu_ps(cg + i * kPanel + j), u = _mm512_loadu_ps(cu + i * kPanel + j);
            if (gate_bias) g = _mm512_add_ps(g, _mm512_loadu_ps(gate_bias + j));
            if (up_bias) u = _mm512_add_ps(u, _mm512_loadu_ps(up_bias + j));
            rill_simd::store_bf16(dst + i * ld + j, rill_simd::silu_mul(rill_simd::round_bf16(g), rill_simd::round_bf16(u)));
        }
#else  // an AMX CPU running a build for an older one (the AVX2 and SSE2 test builds)
        uint16_t g[kPanel], u[kPanel];
        for (int64_t j = 0; j < kPanel; ++j) {
            rill_float::store(g + j, cg[i * kPanel + j] + (gate_bias ? gate_bias[j] : 0.0f));
            rill_float::store(u + j, cu[i * kPanel + j] + (up_bias ? up_bias[j] : 0.0f));
        }
        for (int64_t j = 0; j < kPanel; ++j)
            rill_float::store(dst + i * ld + j, rill_float::silu_mul(rill_float::to_float(g[j]), rill_float::to_float(u[j])));
#endif
    }
}

// Weights are read once per call, straight from memory in a real step (the layers' weights do not
// fit the caches), and AMX tile loads wait for them: measured, a 576 x 3,072 layer at 512 rows
// took 1.6 ms with cold weights against 0.8 with warm ones. So where a thread runs several tiles
// on a panel (a prompt), each tile asks for its share of the next panel ahead of time. Not in a
// decode step (one tile a panel): there the hardware's own prefetch did better, by 10-30%. But up to
// kPrefetchRows rows, requesting the whole panel about to be read before brgemm starts on it (as the int
// GEMVs' prefetch_block does) beat the hardware: at 1-2 rows, Qwen2.5-1.5B's shapes streamed from memory
// took 0.71-0.90x the time (gate_up 1.55 against 2.12 ms, the 151,936-row head 14.5 against 17.8), the
// bundled model's head 0.81-0.91x; at 4 rows 0.8-1.1x, at 8-16 rows it lost up to 15% (Zen 4, 2026-12-04).
//
// out [M, N] = x [M, K] (rows contiguous, K apart) times the packed weight, plus bias (float, or
// null). With silu_mul, out is [M, N / 2] = silu(gate) * up, where the weight's first N / 2
// columns are gate and the others up (N / 2 a multiple of 64): the gate_up projection and the
// SiLU in one pass, so the [M, N] projection is never written out and read back (measured: about
// a third of the MLP's time at 512 rows, the layer's output leaving the caches before the SiLU
// read it). Work is (unit, row tile) pairs, unit-major, where a unit is one panel, or with silu_mul
// a gate panel and its up panel; each thread reads its units once, whatever M is.
void linear(uint16_t* out, const uint16_t* x, const uint16_t* packed, const float* bias, int64_t M, int64_t N,
            int64_t K, bool fixed_tiles, bool silu_mul = false, const Rope* rope = nullptr) {
    using at::BFloat16;
    // The micro-kernel: amx_tiles.h's, else bf16_dot_panel.h's (AVX-512 BF16), else ATen's brgemm.
#ifdef RILL_AMX_TILES
    const bool tiles = K % 32 == 0 && rill_amx_tiles::available();
#else
    constexpr bool tiles = false;
#endif
#ifdef RILL_BF16_DOT
    const bool dot = !tiles && rill_bf16_dot::available() && (fixed_tiles || M <= kDotMaxRows || K > kDotShortK);
#else
    constexpr bool dot = false;
#endif
    const bool own = tiles || dot;  // one of Rill's micro-kernels, which prefetch as they go (ahead)
    // A step of more than kRowBlock rows (a 2,048-token prompt step) in blocks of kRowBlock: each thread's share
    // of a block is the 256 rows the chunked path's sums are sized for, and each block reads the weights once.
    if (M > kRowBlock && !fixed_tiles && own) {
        const int64_t out_cols = silu_mul ? N / 2 : N;
        for (int64_t r0 = 0; r0 < M; r0 += kRowBlock) {
            Rope block_rope{};
            if (rope) block_rope = {rope->cos + r0 * rope->stride, rope->sin + r0 * rope->stride, rope->stride, rope->cols};
            linear(out + r0 * out_cols, x + r0 * K, packed, bias, std::min(kRowBlock, M - r0), N, K, false, silu_mul,
                   rope ? &block_rope : nullptr);
        }
        return;
    }
    const int64_t tile = fixed_tiles ? fixed_tile() : kTile;
    const int64_t P = num_panels(N), num_tiles = (M + tile - 1) / tile, tail_rows = M - (num_tiles - 1) * tile;
    const int64_t panel_elems = K * kPanel, units = silu_mul ? P / 2 : P, out_cols = silu_mul ? N / 2 : N;
    // With fixed_tiles, the last tile's rows, then zeros: every call reads tile rows.
    rill_mem::Buffer<uint16_t> tail;
    if (fixed_tiles && tail_rows < tile) {
        tail = rill_mem::buffer<uint16_t>(tile * K);
        std::memcpy(tail.get(), x + (num_tiles - 1) * tile * K, tail_rows * K * sizeof(uint16_t));
        std::memset(tail.get() + tail_rows * K, 0, (tile - tail_rows) * K * sizeof(uint16_t));
    }
    const int64_t panel_bytes = panel_elems * 2;
#pragma omp parallel
    {
        const auto c = rill_mem::buffer<float>(kTile * kPanel), c2 = rill_mem::buffer<float>(silu_mul ? kTile * kPanel : 0);
#ifdef RILL_AMX_TILES
        std::optional<rill_amx_tiles::Tiles> amx;
        if (tiles) amx.emplace();
#endif
        const char* weights = reinterpret_cast<const char*>(packed);
        // The thread's (unit, row tile) tasks when it splits units with the other threads (a decode step),
        // so the prefetch ahead of a panel stops at the end of the thread's own panels.
        const int64_t nt = omp_get_num_threads(), me = omp_get_thread_num();
        const bool by_rows = (M + kTile - 1) / kTile >= 2 * nt;
        const int64_t task_begin = units * num_tiles * me / nt, task_end = units * num_tiles * (me + 1) / nt;
        const int64_t last_unit = task_end > task_begin ? (task_end - 1) / num_tiles : 0;
        // acc (+)= rows of a (K apart) times k_len rows of panel w, by one of Rill's micro-kernels, which
        // prefetch the bytes [pf, pf + pf_bytes) of weights over the call.
        auto own_panel = [&](const uint16_t* a, int64_t rows, int64_t k_len, const uint16_t* w, float* acc,
                             bool accumulate, const char* pf, int64_t pf_bytes) {
#ifdef RILL_AMX_TILES
            if (tiles) return amx->panel(a, rows, K, k_len, w, acc, accumulate, pf, pf_bytes);
#endif
#ifdef RILL_BF16_DOT
            rill_bf16_dot::panel(a, rows, K, k_len, w, acc, accumulate, pf, pf_bytes);
#endif
        };
        // acc = rows of a times panel `panel`.
        auto gemm = [&](const uint16_t* a, int64_t rows, int64_t panel, float* acc, const char* pf, int64_t pf_bytes) {
            if (own) return own_panel(a, fixed_tiles ? tile : rows, K, packed + panel * panel_elems, acc, false, pf, pf_bytes);
            at::native::cpublas::brgemm(fixed_tiles ? tile : rows, kPanel, K, K, kPanel, kPanel, false,
                                        reinterpret_cast<const BFloat16*>(a),
                                        reinterpret_cast<const BFloat16*>(packed + panel * panel_elems), acc);
        };
        // What a call on `panel` prefetches: the i-th of n shares of the next panel where the thread runs
        // n tiles on each (a prompt), else (a decode step) the panel's bytes kPrefetchAhead on, within the
        // thread's panels (from `panel` to stream_end, the panel after its last).
        auto ahead = [&](int64_t panel, int64_t i_th, int64_t n, int64_t stream_end) -> std::pair<const char*, int64_t> {
            if (n > 1) {
                if (panel + 1 >= stream_end) return {nullptr, 0};
                const int64_t share = (panel_bytes + n - 1) / n, begin = std::min(panel_bytes, i_th * share);
                return {weights + (panel + 1) * panel_bytes + begin, std::min(share, panel_bytes - begin)};
            }
            const char* pf = weights + panel * panel_bytes + std::min(panel_bytes, kPrefetchAhead);
            return {pf, std::min<int64_t>(panel_bytes, weights + stream_end * panel_bytes - pf)};
        };
        auto prefetch = [&](int64_t panel, int64_t i_th, int64_t n) {  // the i-th of n shares, towards L2
            const char* p = weights + panel * panel_bytes;
            const int64_t share = (panel_bytes + n - 1) / n;
            for (int64_t off = i_th * share; off < std::min(panel_bytes, (i_th + 1) * share); off += 64)
                __builtin_prefetch(p + off, 0, 2);
        };
        auto rows_of = [&](int64_t t) { return t == num_tiles - 1 ? tail_rows : tile; };
        // The epilogue of tile t of unit u from its float32 sums (cu: the up panel's with silu_mul).
        auto finish = [&](int64_t u, int64_t t, int64_t rows, const float* cg, const float* cu) {
            const int64_t n0 = u * kPanel;
            uint16_t* dst = out + t * tile * out_cols + n0;
            if (silu_mul) {
                store_silu_tile(dst, out_cols, cg, cu, bias ? bias + n0 : nullptr, bias ? bias + out_cols + n0 : nullptr, rows);
            } else if (rope && n0 < rope->cols) {
                store_rope_tile(dst, out_cols, cg, bias ? bias + n0 : nullptr, rows,
                                rope->cos + t * tile * rope->stride, rope->sin + t * tile * rope->stride, rope->stride);
            } else {
                store_tile(dst, out_cols, cg, bias ? bias + n0 : nullptr, rows, std::min(kPanel, N - n0));
            }
        };
        // Tile t of unit u; it is the i-th of the n tiles this thread runs on u (for the prefetch).
        auto run = [&](int64_t u, int64_t t, int64_t i_th, int64_t n) {
            const int64_t rows = rows_of(t);
            const uint16_t* a = fixed_tiles && rows < tile ? tail.get() : x + t * tile * K;
            if (!own && n > 1 && u + 1 < units) {  // this tile's share of the next unit (own kernels prefetch: ahead)
                prefetch(u + 1, i_th, n);
                if (silu_mul) prefetch(u + 1 + units, i_th, n);
            } else if (!own && n == 1 && M <= kPrefetchRows) {  // a decode step's panel, as a whole
                rill_simd::prefetch_block(packed + u * panel_elems, panel_elems * 2);
                if (silu_mul) rill_simd::prefetch_block(packed + (u + units) * panel_elems, panel_elems * 2);
            }
            const int64_t end = by_rows ? units : last_unit + 1;
            const auto [pf, pf_bytes] = own ? ahead(u, i_th, n, end) : std::pair<const char*, int64_t>{nullptr, 0};
            gemm(a, rows, u, c.get(), pf, pf_bytes);
            if (silu_mul) {
                const auto [pf2, pf2_bytes] = own ? ahead(u + units, i_th, n, end + units) : std::pair<const char*, int64_t>{nullptr, 0};
                gemm(a, rows, u + units, c2.get(), pf2, pf2_bytes);
            }
            finish(u, t, rows, c.get(), c2.get());
        };
        // A prompt: each thread its own rows, all units (the rows it reads and the outputs it
        // writes stay in its L2; both threads read each panel at about the same time, the second
        // from L3). A decode step: each thread its own units, so the weights are read once.
        // Decided on 32-row tiles whatever the tile: with --batch-invariant's small ones a decode step
        // of 32 rows is 8 tiles, and split by rows each thread read every weight (the LM head's too).
        if (by_rows) {
            const int64_t t_begin = num_tiles * me / nt, t_end = num_tiles * (me + 1) / nt;
#if defined(RILL_AMX_TILES) || defined(RILL_BF16_DOT)
            // The thread's rows outgrow what its L2 keeps across panels (down_proj's 8,960 inputs at 512 rows:
            // 4.6 MB a thread, read again for every panel): K in chunks whose rows fit, over groups of units
            // whose float32 sums wait in acc between the chunks (the same multiplies in the same order, so the
            // same bits). Qwen2.5-1.5B's down_proj at 512 rows: 7.5 against 10.2 ms unchunked.
            const int64_t row_bytes = (t_end - t_begin) * tile * K * 2;
            if (own && !fixed_tiles && row_bytes > kChunkedRowBytes) {
                const int64_t k_chunk = std::max<int64_t>(256, kChunkedRowBytes / ((t_end - t_begin) * tile * 2) / 32 * 32);
                const int64_t per_unit = silu_mul ? 2 : 1, n = t_end - t_begin, slot_elems = kTile * kPanel;
                const auto acc = rill_mem::buffer<float>(n * kChunkGroup * per_unit * slot_elems);
                auto slot = [&](int64_t t, int64_t g, int64_t which) {
                    return acc.get() + ((t - t_begin) * kChunkGroup * per_unit + g * per_unit + which) * slot_elems;
                };
                auto slice = [&](int64_t panel, int64_t k0) { return weights + panel * panel_bytes + k0 * kPanel * 2; };
                for (int64_t g0 = 0; g0 < units; g0 += kChunkGroup) {
                    const int64_t g1 = std::min(units, g0 + kChunkGroup);
                    for (int64_t k0 = 0; k0 < K; k0 += k_chunk) {
                        const int64_t k_len = std::min(k_chunk, K - k0);
                        for (int64_t u = g0; u < g1; ++u)
                            for (int64_t which = 0; which < per_unit; ++which) {
                                // the slice after this one, which this panel's tiles prefetch a share each of
                                const char* next = nullptr;
                                int64_t next_bytes = 0;
                                if (which + 1 < per_unit) next = slice(u + units, k0), next_bytes = k_len * kPanel * 2;
                                else if (u + 1 < g1) next = slice(u + 1, k0), next_bytes = k_len * kPanel * 2;
                                else if (k0 + k_chunk < K) next = slice(g0, k0 + k_chunk), next_bytes = std::min(k_chunk, K - k0 - k_chunk) * kPanel * 2;
                                else if (g1 < units) next = slice(g1, 0), next_bytes = std::min(k_chunk, K) * kPanel * 2;
                                const int64_t share = (next_bytes + n - 1) / n;
                                for (int64_t t = t_begin; t < t_end; ++t) {
                                    const int64_t begin = std::min(next_bytes, (t - t_begin) * share);
                                    own_panel(x + t * tile * K + k0, rows_of(t), k_len,
                                               packed + (u + which * units) * panel_elems + k0 * kPanel, slot(t, u - g0, which),
                                               k0 > 0, next ? next + begin : nullptr, std::min(share, next_bytes - begin));
                                }
                            }
                    }
                    for (int64_t u = g0; u < g1; ++u)
                        for (int64_t t = t_begin; t < t_end; ++t)
                            finish(u, t, rows_of(t), slot(t, u - g0, 0), slot(t, u - g0, per_unit - 1));
                }
            } else
#endif
            for (int64_t u = 0; u < units; ++u)
                for (int64_t t = t_begin; t < t_end; ++t) run(u, t, t - t_begin, t_end - t_begin);
        } else {
            for (int64_t task = task_begin; task < task_end; ++task)
                run(task / num_tiles, task % num_tiles, task % num_tiles, num_tiles);
        }
        if (!own) at::native::cpublas::brgemm_release();
    }
}

}  // namespace
}  // namespace rill_amx_linear

namespace rill_cpu {

// AMX-BF16, or a build for a CPU with AVX-512 BF16 (Zen 4, Cooper Lake): there oneDNN's brgemm takes
// the same packed pairs and multiplies them with vdpbf16ps. prefill_attention.cpp asks this too.
bool amx_linear_supported() {
#ifdef RILL_BF16_SIMD
    return true;
#else
    return at::native::cpublas::could_pack(at::kBFloat16);
#endif
}

std::string amx_linear_kernel(const std::optional<std::string>& use) {
    if (use) {
        TORCH_CHECK(*use == "avx512_bf16" || *use == "brgemm", "amx_linear_kernel: use avx512_bf16 or brgemm");
#ifdef RILL_BF16_DOT
        rill_bf16_dot::enabled().store(*use == "avx512_bf16");
#endif
    }
#ifdef RILL_AMX_TILES
    if (rill_amx_tiles::available()) return "amx_tiles";
#endif
#ifdef RILL_BF16_DOT
    if (rill_bf16_dot::available()) return "avx512_bf16";
#endif
    return "brgemm";
}

namespace {

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
    at::Tensor out = x.new_empty({M, silu_mul ? out_features / 2 : out_features});
    if (M == 0) return out;
    const at::Tensor xc = x.contiguous();
    at::Tensor b;
    if (bias.has_value()) b = bias->to(at::kFloat).contiguous();
    rill_amx_linear::linear(reinterpret_cast<uint16_t*>(out.data_ptr()), reinterpret_cast<const uint16_t*>(xc.data_ptr()),
                            reinterpret_cast<const uint16_t*>(packed.data_ptr()),
                            b.defined() ? b.data_ptr<float>() : nullptr, M, out_features, K, fixed_tiles, silu_mul, rope);
    return out;
}

}  // namespace

at::Tensor amx_linear_pack(const at::Tensor& weight) {
    TORCH_CHECK(amx_linear_supported(), "amx_linear_pack: this CPU has neither AMX-BF16 nor AVX-512 BF16");
    TORCH_CHECK(weight.scalar_type() == at::kBFloat16 && weight.dim() == 2 && weight.size(1) % 2 == 0,
                "amx_linear_pack: a bfloat16 weight [out, in] with an even number of inputs");
    const at::Tensor w = weight.contiguous();
    const int64_t N = w.size(0), K = w.size(1);
    at::Tensor out = w.new_empty({rill_amx_linear::num_panels(N), K * rill_amx_linear::kPanel});
    rill_amx_linear::pack(reinterpret_cast<uint16_t*>(out.data_ptr()), reinterpret_cast<const uint16_t*>(w.data_ptr()),
                          N, K);
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

}  // namespace rill_cpu
