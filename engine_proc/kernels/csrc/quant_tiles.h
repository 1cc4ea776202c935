// The quantized linears' products on AMX tiles, where amx_tiles.h's kernel may run (quant_panels.cpp calls it
// in place of brgemm): the unpacked weight is the A operand, so each row goes to the tiles as quant_rows.h's
// pairs_of() gives it (32 k in order), with no transpose; x, small in a decode step, is the one turned into pairs
// of k (once a call), and the outputs are transposed on their way out.
//
// Why: brgemm over the panels spent most of its time transposing them; Qwen2.5-1.5B's 28 layers and head at 32
// rows (bench.kernels.int4_linears, a 2-core Xeon with AMX) took 252 ms in 4-bit against 133 here, and 262 against
// 99 in int8, where bfloat16 weights take 123. What is left is the unpacking, which the tile multiplies do not
// overlap: its loop over a block's rows is unrolled (each row's address and parameters otherwise took scalar
// instructions from the vector ports), and int4 looks its values up in a table (quant_rows.h); with both, the
// 1.5B's 28 int4 layers took 83 ms at 16 rows against 119, 96 against 132 at 32 and 327 against 375 at 256
// (2026-12-06; the tiles' multiplies alone, about 40 ms at 16-32 rows). A software prefetch to L1 alone
// (prefetchnta) ahead of each row's reads made the unpacking 2-2.7x slower on that Xeon: the next block's rows are
// prefetched to L2 instead.
//
// Per thread, a block of 32 weight rows at a time: C [32 n][32 m] float32 = the block times x's pairs
// [K / 2][32 m][2] for every 32 activation rows, four tiles accumulated over K, stored, and written to y [m][n]
// transposed. A decode step (up to 32 rows) unpacks each k step's 32 x 32 weights into a ring of A tiles in L1 just
// before their multiplies (with the whole block unpacked first, then multiplied, a 32-row step of gate_up took 1.3x
// as long); a prompt unpacks the whole block first, [K / 32][32 rows][32 k] in L2, for all its activation rows.
//
// Bits: each output is one dot product over k pairs in ascending order into one float32 accumulator, the tile
// multiplies' own, as brgemm's over the panels: batch invariant by construction.
#pragma once
#include "amx_tiles.h"
#include "quant_rows.h"

#if defined(RILL_AMX_TILES) && defined(RILL_BF16_SIMD)
#define RILL_QUANT_TILES 1
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "aligned.h"

namespace rill_quant_tiles {

constexpr int64_t kRows = 32;  // weight rows a block: two A tiles
constexpr int64_t kCols = 32;  // activation rows a pass: two B tiles
constexpr int64_t kRing = 4;   // A tiles' buffers a decode step's k steps take in turn
// A prompt's rows a call takes at most: each block's unpacked weight is multiplied into all of them, whose pairs
// (re-read for each block) must stay near. Qwen2.5-1.5B's layers on a 2-core Xeon with AMX took 1.28 ms a row at
// 512 rows, 1.40 at 256 and 1.83 at 1,024, where the weight converted for oneDNN's GEMM took 1.62 (2026-12-06).
constexpr int64_t kPromptRows = 512;

// All eight tiles 16 rows of 64 bytes. 0-3: C (weight rows 0-15 and 16-31 by activation rows 0-15 and 16-31,
// float32); 4, 5: A (weight rows 0-15, 16-31; 32 k); 6, 7: B (16 pairs of k; activation rows 0-15, 16-31).
inline void configure() {
    rill_amx_tiles::TileConfig cfg;
    for (int t = 0; t < 8; ++t) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    asm volatile("ldtilecfg %0" ::"m"(cfg));  // through asm: amx_tiles.h says why
}

// Block b of x [M, K] bfloat16 (rows K apart) into xv [ceil(M / 32)][K / 2][32][2]: pairs of k, 32 rows a block,
// rows past M zero. K a multiple of 32.
inline void pack_x(uint16_t* xv, const uint16_t* x, int64_t M, int64_t K, int64_t b) {
    const int64_t pairs = K / 2;
    for (int64_t p0 = 0; p0 < pairs; p0 += 16)
        for (int64_t h = 0; h < 2; ++h) {
            __m512i r[16];
            for (int64_t i = 0; i < 16; ++i) {
                const int64_t m = b * kCols + h * 16 + i;
                r[i] = m < M ? _mm512_loadu_si512(x + m * K + 2 * p0) : _mm512_setzero_si512();
            }
            rill_quant_rows::transpose16(r);  // r[j]: pair p0 + j of the 16 rows
            for (int64_t j = 0; j < 16; ++j)
                _mm512_store_si512(xv + ((b * pairs + p0 + j) * kCols + h * 16) * 2, r[j]);
        }
}

// The two halves of a block of 32 weight rows: rows [n0, n0 + 16) and [n0 + 16, n0 + 32), their parameters
// read (rows past N zero); prefetch() requests the next block's rows to L2, a few per k step.
template <typename Rows>
struct Block {
    Rows lo, hi;
    int64_t N, n0, live_lo, live_hi;
    void begin(int64_t n) {
        n0 = n;
        live_lo = std::clamp<int64_t>(N - n0, 0, 16);
        live_hi = std::clamp<int64_t>(N - n0 - 16, 0, 16);
        lo.begin(n0, live_lo);
        hi.begin(n0 + 16, live_hi);
    }
    // The 32 rows' group g as two A tiles: [32 rows][32 k] bfloat16 at a.
    void unpack(uint16_t* a, int64_t g) const {
#pragma GCC unroll 16
        for (int64_t j = 0; j < 16; ++j)
            _mm512_store_si512(a + j * 32, j < live_lo ? lo.pairs_of(n0, j, g) : _mm512_setzero_si512());
#pragma GCC unroll 16
        for (int64_t j = 0; j < 16; ++j)
            _mm512_store_si512(a + (16 + j) * 32, j < live_hi ? hi.pairs_of(n0 + 16, j, g) : _mm512_setzero_si512());
    }
    // At k step s of `steps`: the next block's rows whose turn it is (all 32 by the end).
    void prefetch(int64_t s, int64_t steps) const {
        const int64_t per_step = (kRows + steps - 1) / steps;
        for (int64_t n = n0 + kRows + s * per_step; n < std::min(n0 + kRows + (s + 1) * per_step, N); ++n)
            lo.prefetch_row(n);
    }
};

// c [32 weight rows][32 activation rows] float32 = the block's A tiles times xb's pairs ([K / 2][32][2]), a_of(s)
// giving k step s's two A tiles ([32 rows][32 k]). Activation rows 16-31 only with two_cols (else those columns of c
// are zero).
template <typename AOf>
void block_product(AOf&& a_of, const uint16_t* xb, int64_t K, float* c, bool two_cols) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t s = 0; s < K / 32; ++s) {
        const uint16_t *as = a_of(s), *bs = xb + s * 16 * kCols * 2;
        _tile_loadd(4, as, 64);
        _tile_loadd(5, as + 16 * 32, 64);
        _tile_loadd(6, bs, kCols * 4);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(2, 5, 6);
        if (two_cols) {
            _tile_loadd(7, bs + 32, kCols * 4);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, c, kCols * 4);
    _tile_stored(1, c + 16, kCols * 4);
    _tile_stored(2, c + 16 * kCols, kCols * 4);
    _tile_stored(3, c + 16 * kCols + 16, kCols * 4);
}

// y [m0 + i][n0 + n] = c[n][i] (times row_scale[n0 + n], bfloat16 bits, where given), for rows below M and
// columns below N.
inline void store_block(uint16_t* y, int64_t M, int64_t N, int64_t m0, int64_t n0, const float* c,
                        const uint16_t* row_scale) {
    for (int64_t nh = 0; nh < kRows && n0 + nh < N; nh += 16) {
        const __mmask16 cols = rill_simd::tail_mask(N - n0 - nh);
        const __m512 scale = row_scale ? rill_simd::load_bf16(row_scale + n0 + nh, cols) : _mm512_set1_ps(1.0f);
        for (int64_t mh = 0; mh < kCols && m0 + mh < M; mh += 16) {
            __m512i r[16];
            for (int64_t i = 0; i < 16; ++i) r[i] = _mm512_load_si512(c + (nh + i) * kCols + mh);
            rill_quant_rows::transpose16(r);  // r[i]: activation row mh + i over the 16 weight rows
            for (int64_t i = 0; i < 16 && m0 + mh + i < M; ++i)
                rill_simd::store_bf16(y + (m0 + mh + i) * N + n0 + nh,
                                      _mm512_mul_ps(_mm512_castsi512_ps(r[i]), scale), cols);
        }
    }
}

// linear() for up to kPromptRows rows.
template <typename MakeRows>
void rows_linear(uint16_t* y, const uint16_t* x, int64_t M, int64_t N, int64_t K, MakeRows&& make_rows,
                 const uint16_t* row_scale) {
    const int64_t X = (M + kCols - 1) / kCols, blocks = (N + kRows - 1) / kRows;
    const auto xv = rill_mem::buffer<uint16_t>(X * K * kCols);
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int64_t b = 0; b < X; ++b) pack_x(xv.get(), x, M, K, b);
        const auto a = rill_mem::buffer<uint16_t>(X > 1 ? K * kRows : kRing * kRows * 32);
        const auto params = rill_mem::buffer<float>(4 * 16 * (K / 32));
        const auto c = rill_mem::buffer<float>(kRows * kCols);
        Block<decltype(make_rows(params.get()))> block{make_rows(params.get()), make_rows(params.get() + 2 * 16 * (K / 32)),
                                                      N};
        configure();
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; ++b) {
            block.begin(b * kRows);
            if (X == 1) {  // a decode step: each k step's group unpacked into a ring of A tiles (in L1) as it comes
                block_product([&](int64_t s) {
                    uint16_t* as = a.get() + (s % kRing) * kRows * 32;
                    block.unpack(as, s);
                    block.prefetch(s, K / 32);
                    return as;
                }, xv.get(), K, c.get(), M > 16);
                store_block(y, M, N, 0, b * kRows, c.get(), row_scale);
                continue;
            }
            // A prompt: the whole block unpacked first, [K / 32][32 rows][32 k] (in L2), then each 32 activation rows.
            for (int64_t s = 0; s < K / 32; ++s) {
                block.unpack(a.get() + s * kRows * 32, s);
                block.prefetch(s, K / 32);
            }
            for (int64_t xb = 0; xb < X; ++xb) {
                block_product([&](int64_t s) { return a.get() + s * kRows * 32; }, xv.get() + xb * K * kCols, K, c.get(),
                              M - xb * kCols > 16);
                store_block(y, M, N, xb * kCols, b * kRows, c.get(), row_scale);
            }
        }
        _tile_release();
    }
}

// y [M, N] bfloat16 = x [M, K] bfloat16 times the weight whose rows make_rows(params) reads (quant_rows.h), each
// output column times row_scale[n] (bfloat16 bits) where given. K a multiple of 32; the caller has checked
// rill_amx_tiles::available(). A long prompt goes kPromptRows rows at a time, each unpacking the weight again.
template <typename MakeRows>
void linear(uint16_t* y, const uint16_t* x, int64_t M, int64_t N, int64_t K, MakeRows&& make_rows,
            const uint16_t* row_scale) {
    for (int64_t m0 = 0; m0 < M; m0 += kPromptRows)
        rows_linear(y + m0 * N, x + m0 * K, std::min(kPromptRows, M - m0), N, K, make_rows, row_scale);
}

}  // namespace rill_quant_tiles
#endif
