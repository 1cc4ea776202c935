// Rill's own AMX micro-kernel for amx_linear.cpp: up to 32 rows of x times one packed 64-column panel,
// with the next weights prefetched between its tile multiplies. Compiled where the build's target has
// AMX-BF16 (-march=native on such a CPU); available() says whether this process may use the tiles.
//
// Why not ATen's brgemm (oneDNN's micro-kernels), which amx_linear.cpp calls elsewhere: with weights
// streamed from memory, a brgemm call computes on a panel only once its loads have come in, and the
// memory idles while it does, so a 32-row decode step read Qwen2.5-1.5B's weights at about 21 GB/s of
// this VM's 27. Prefetching ahead of a brgemm call in a burst was slower still (the core stalls on its
// fill buffers). Here the prefetches of the weights 128 KB ahead are spread over the k loop, one or a few
// lines per step of four tile multiplies. Measured on a 2-core Xeon with AMX against the brgemm path
// (one-off timings of Qwen2.5-1.5B's layer shapes in one process, weights cold: 1.2 GB of copies):
// at 32 rows gate_up_proj (1,536 x 17,920) 1.97-2.13 against 2.62-2.92 ms, the 151,936-row head 16.9-17.4
// against 22.3-22.6 ms; at 1 row 1.83 against 2.13 and 15.5 against 18.5 ms; at 512 rows gate_up_proj
// 12.2 against 15.9 ms (oneDNN's inner product: 12.2).
//
// Bits: each row of C is its own dot products over k in the same order whatever the row count, tile
// after tile (32 k each) into float32 accumulators: the same bits as brgemm's on the CPUs tested (the
// tests compare them), and batch invariant by construction.
#pragma once

#include <cstdint>
#include <cstdlib>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define RILL_AMX_TILES 1

namespace rill_amx_tiles {

// Linux hands out the tile registers' state only to a process that asks (arch_prctl), once.
// RILL_AMX_TILES=0 keeps brgemm instead (to compare the two).
inline bool available() {
    static const bool ok = [] {
        const char* env = std::getenv("RILL_AMX_TILES");
        if (env && env[0] == '0') return false;
        return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    }();
    return ok;
}

struct alignas(64) TileConfig {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

// Tiles 0-1: C of rows 0-15 (columns 0-15, 16-31 of the half-panel); 2-3: C of rows 16-31; 4, 5: x's rows
// 0-15 and 16-31 (32 k); 6, 7: the panel's 32 k x 16 columns. m0 rows in the first row tile, m1 (0-16) in the second.
// Loaded through asm: GCC 12 drops the stores to the config ahead of _tile_loadconfig (not seen as a read
// of them), and the tiles then run unconfigured (SIGILL at the first tilezero).
inline void configure(int m0, int m1) {
    TileConfig cfg;
    const int r1 = m1 ? m1 : 1;
    const uint8_t rows[8] = {uint8_t(m0), uint8_t(m0), uint8_t(r1), uint8_t(r1), uint8_t(m0), uint8_t(r1), 16, 16};
    for (int t = 0; t < 8; ++t) {
        cfg.rows[t] = rows[t];
        cfg.colsb[t] = 64;
    }
    asm volatile("ldtilecfg %0" ::"m"(cfg));
}

// c [rows][64] floats = x [rows, k_len] (rows lda apart) times panel (k_len / 2 rows of 128 packed
// elements: element (k, j) at (k / 2) * 128 + j * 2 + k % 2), plus c itself with `accumulate`. rows <= 32,
// k_len a multiple of 32. The `pf_bytes` from pf are prefetched (to L2) evenly over the k loop; pf may be null.
template <bool kTwoRowTiles>
inline void panel_rows(const uint16_t* x, int64_t lda, int64_t k_len, const uint16_t* panel, float* c, bool accumulate,
                       const char* pf, int64_t pf_bytes) {
    const int64_t steps = k_len / 32, lines = pf ? pf_bytes / 64 : 0, per_step = (lines + 2 * steps - 1) / (2 * steps);
    int64_t next_line = 0;
    for (int half = 0; half < 2; ++half) {
        float* ch = c + half * 32;
        if (accumulate) {
            _tile_loadd(0, ch, 256);
            _tile_loadd(1, ch + 16, 256);
            if constexpr (kTwoRowTiles) {
                _tile_loadd(2, ch + 16 * 64, 256);
                _tile_loadd(3, ch + 16 * 64 + 16, 256);
            }
        } else {
            _tile_zero(0);
            _tile_zero(1);
            if constexpr (kTwoRowTiles) {
                _tile_zero(2);
                _tile_zero(3);
            }
        }
        const uint16_t* b = panel + half * 64;  // columns half * 32 .. of each 128-element pair row
        for (int64_t s = 0; s < steps; ++s) {
            _tile_loadd(4, x + s * 32, lda * 2);
            if constexpr (kTwoRowTiles) _tile_loadd(5, x + 16 * lda + s * 32, lda * 2);
            _tile_loadd(6, b + s * 16 * 128, 256);
            _tile_loadd(7, b + s * 16 * 128 + 32, 256);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            if constexpr (kTwoRowTiles) {
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
            for (int64_t i = 0; i < per_step && next_line < lines; ++i, ++next_line)
                _mm_prefetch(pf + next_line * 64, _MM_HINT_T1);
        }
        _tile_stored(0, ch, 256);
        _tile_stored(1, ch + 16, 256);
        if constexpr (kTwoRowTiles) {
            _tile_stored(2, ch + 16 * 64, 256);
            _tile_stored(3, ch + 16 * 64 + 16, 256);
        }
    }
}

// One thread's use of the tiles within one parallel region: it loads a config when a call's row count
// needs another, and lets the tiles go at the end (as brgemm_release does; brgemm's calls elsewhere
// load configs of their own, so none is assumed to survive a region).
class Tiles {
public:
    ~Tiles() { _tile_release(); }

    // c [rows][64] = x [rows, k_len] (rows lda apart) times the packed panel rows w (+ c with accumulate).
    void panel(const uint16_t* x, int64_t rows, int64_t lda, int64_t k_len, const uint16_t* w, float* c, bool accumulate,
               const char* pf, int64_t pf_bytes) {
        const int m0 = rows < 16 ? int(rows) : 16, m1 = rows > 16 ? int(rows - 16) : 0, key = m0 * 64 + m1;
        if (key != configured_) {
            configure(m0, m1);
            configured_ = key;
        }
        if (m1) panel_rows<true>(x, lda, k_len, w, c, accumulate, pf, pf_bytes);
        else panel_rows<false>(x, lda, k_len, w, c, accumulate, pf, pf_bytes);
    }

private:
    int configured_ = -1;
};

}  // namespace rill_amx_tiles
#endif
