/* Batch-invariant matrix products for the forward pass: out (M, N) = x (M, K) @ w (N, K)^T
 * (+ bias), for float32, bfloat16, int8 (per-channel scale) and int4 (groups of 32) weights
 * (inference/kernels/cpu.py wraps it; inference/models/quant.py's `linear` calls it).
 *
 * Why our own: a row's result from torch's CPU matmuls depends on how many rows are multiplied
 * together (MKL sums K in another order for one row than for several; oneDNN picks kernels by
 * shape), so the same token got different logits alone, in a batch, in a prefill chunk or in a
 * decode step. Here every output element is one sum in one order whatever M is:
 *   lane l of a PG_VL-wide float32 accumulator adds x[k] * w[k] for k = l, l + PG_VL, ... in
 *   order (fused multiply-add), then the lanes are added in a fixed tree (`vsum`), then the
 *   tail of K, the int8 scale and the bias.
 * Tiles of MR rows x NR outputs share each weight load and each dequantization (so a step of
 * 8 rows reads and unpacks the weights once: more rows cost little more, which is what makes
 * batching pay); the last rows use smaller tiles with the same per-element sequence; the thread
 * pool (threads.c) splits the outputs (one element is always computed whole by one thread).
 *
 * Weights, each row n of the (N, K) matrix at w + n * K:
 *   PG_F32 float32; PG_BF16 bfloat16; PG_INT8 int8 codes, w = code * scales[n];
 *   PG_INT4 (N, K / 2) bytes, groups of 32 along K: the group's 16 bytes hold its weights 0-15
 *   in their low nibbles and 16-31 in their high ones (a GGUF Q4 block's order), and
 *   w = (q - 8) * scale + zero with (scale, zero) = scales[(g * N + n) * 2 + 0, 1].
 * x is float32 or bfloat16 (widened once into a per-thread buffer); scales, bias and out are
 * float32 or bfloat16 (`*_bf16` flags). Products and sums are float32.
 *
 * With bfloat16 x on a CPU with AMX, `pg_matmul` hands bfloat16, int8 and int4 weights to
 * matmul_amx.c first, whose order is its own (k in order into one float32 accumulator per
 * element, 32 k per instruction); without AMX, int8 and int4 weights go to AVX512-BF16 dot
 * products where the CPU has them (matmul_avx512bf16.c, pairs of k per lane). A weight always
 * takes one path, whatever M is.
 */
#include <stdlib.h>

#include "simd.h"
#include "threads.h"

enum { PG_F32 = 0, PG_BF16 = 1, PG_INT8 = 2, PG_INT4 = 3 };
#define INT4_GROUP 32
#if PG_VL == 16
#define MR_MAX 8  // 32 vector registers: a decode step of 8 rows reads each weight once
#else
#define MR_MAX 4  // 16 vector registers
#endif
#define NR_MAX 8
/* int4 tiles take up to 8 rows at once, whatever K: a decode step's weights are unpacked once
 * (8 rows of x stay in L2 even for the MLP's long down projection; limiting them to what fits
 * in L1 made Qwen2.5's down projection unpack its weights for every row). */
#define INT4_MR_MAX 8
#define INT4_PANEL_ROWS 32  // from this many rows on, int4 weights are unpacked into float32 panels

typedef struct {
    const float *x;  // (M, K) float32
    int64_t M, K, N;
    int kind;
    const void *w, *scales, *bias;
    int scales_bf16, bias_bf16;
    void *out;  // (M, N)
    int out_bf16;
} Args;

/* PG_VL weights of row n from column k, as float32 (f32, bf16 and int8 rows). */
PG_INLINE vf load_weights(const int kind, const void *w, int64_t K, int64_t n, int64_t k) {
    if (kind == PG_F32) return vload((const float *)w + n * K + k);
    if (kind == PG_BF16) return vload_bf16((const uint16_t *)w + n * K + k);
    return vload_i8((const int8_t *)w + n * K + k);
}

static inline float load_weight(int kind, const void *w, int64_t K, int64_t n, int64_t k) {
    if (kind == PG_F32) return ((const float *)w)[n * K + k];
    if (kind == PG_BF16) return load_at(w, 1, n * K + k);
    return (float)((const int8_t *)w)[n * K + k];
}

/* The finished sums of a tile: the int8 scale, the bias, rounded once to out's dtype. */
PG_INLINE void finish(const Args *a, int64_t m, int64_t n, const int MR, const int NR, float sums[MR_MAX][NR_MAX]) {
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) {
            float v = sums[i][j];
            if (a->kind == PG_INT8) v *= load_at(a->scales, a->scales_bf16, n + j);
            if (a->bias) v += load_at(a->bias, a->bias_bf16, n + j);
            store_at(a->out, a->out_bf16, (m + i) * a->N + n + j, v);
        }
}

/* Rows m..m+MR-1, outputs n..n+NR-1 of a float32 / bfloat16 / int8 weight. */
PG_INLINE void tile_rows(const int kind, const int MR, const int NR, const Args *a, int64_t m, int64_t n) {
    const int64_t K = a->K;
    const float *x = a->x + m * K;
    vf acc[MR_MAX][NR_MAX];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) acc[i][j] = vzero();
    int64_t k = 0;
    for (; k + PG_VL <= K; k += PG_VL) {
        vf wv[NR_MAX];
        for (int j = 0; j < NR; j++) wv[j] = load_weights(kind, a->w, K, n + j, k);
        for (int i = 0; i < MR; i++) {
            vf xv = vload(x + i * K + k);
            for (int j = 0; j < NR; j++) acc[i][j] = vfma(xv, wv[j], acc[i][j]);
        }
    }
    float sums[MR_MAX][NR_MAX];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) {
            float s = vsum(acc[i][j]);
            for (int64_t t = k; t < K; t++) s = sfma(x[i * K + t], load_weight(kind, a->w, K, n + j, t), s);
            sums[i][j] = s;
        }
    finish(a, m, n, MR, NR, sums);
}

/* int4 weights are consumed in "unpack order": for each PG_VL bytes of a group (its half h),
 * the weights in their low nibbles, then those in their high ones (AVX2: k 0-7, 16-23, 8-15,
 * 24-31; AVX-512: k 0-15, 16-31), so each widened byte vector is used twice at once. x is
 * copied in that same order (`int4_x`), and the panels of `run_int4_panels` too, so every path
 * adds the same products in the same order. Unpack position v of a group is natural vector: */
#define INT4_HALVES (INT4_GROUP / PG_VL / 2)  // byte vectors per group
PG_INLINE int int4_natural(int v) { return v / 2 + (v % 2) * INT4_HALVES; }

/* The int4 weights of a row's group g at unpack positions 2h (low nibbles) and 2h + 1 (high):
 * (q - 8) * scale + zero, rounded once (torch's int4 kernel's reading). */
PG_INLINE void int4_weights(const uint8_t *row, int64_t g, int h, vf scale, vf zero, vf *low, vf *high) {
    vi32 b = vload_u8(row + g * (INT4_GROUP / 2) + h * PG_VL);
    *low = vfma(__builtin_convertvector((b & 15) - 8, vf), scale, zero);
    *high = vfma(__builtin_convertvector((b >> 4) - 8, vf), scale, zero);
}

/* Scales and zeros of group g for outputs n..n+NR-1: (scale, zero) pairs are adjacent, so four
 * outputs' are one 16-byte load. */
PG_INLINE void int4_group_scales(const Args *a, const int NR, int64_t g, int64_t n, vf *scale, vf *zero) {
    float pairs[2 * NR_MAX];
    const int64_t at = (g * a->N + n) * 2;
#if defined(__AVX2__)
    if (NR == 4 && a->scales_bf16) {
        __m128i raw = _mm_loadu_si128((const void *)((const uint16_t *)a->scales + at));
        _mm256_storeu_ps(pairs, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16)));
    } else
#endif
        for (int t = 0; t < 2 * NR; t++) pairs[t] = load_at(a->scales, a->scales_bf16, at + t);
    for (int j = 0; j < NR; j++) {
        scale[j] = vsplat(pairs[2 * j]);
        zero[j] = vsplat(pairs[2 * j + 1]);
    }
}

/* Rows m..m+MR-1 (MR <= 8), outputs n..n+NR-1 of an int4 weight: each group's weights are
 * unpacked and scaled once, then used by every row. The same products in the same order as
 * `tile_rows` over an unpacked panel (`run_int4_panels`): one result either way. */
PG_INLINE void tile_int4(const int MR, const int NR, const Args *a, int64_t m, int64_t n) {
    const int64_t K = a->K, row_bytes = K / 2;
    const float *x = a->x + m * K;  // in unpack order
    const uint8_t *packed = (const uint8_t *)a->w;
    vf acc[INT4_MR_MAX][NR_MAX];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) acc[i][j] = vzero();
    for (int64_t g = 0; g < K / INT4_GROUP; g++) {
        vf scale[NR_MAX], zero[NR_MAX];
        int4_group_scales(a, NR, g, n, scale, zero);
        for (int h = 0; h < INT4_HALVES; h++) {
            vf low[NR_MAX], high[NR_MAX];
            for (int j = 0; j < NR; j++) int4_weights(packed + (n + j) * row_bytes, g, h, scale[j], zero[j], &low[j], &high[j]);
            for (int i = 0; i < MR; i++) {
                const float *xg = x + i * K + g * INT4_GROUP + 2 * h * PG_VL;
                vf x_low = vload(xg), x_high = vload(xg + PG_VL);
                for (int j = 0; j < NR; j++) acc[i][j] = vfma(x_high, high[j], vfma(x_low, low[j], acc[i][j]));
            }
        }
    }
    float sums[INT4_MR_MAX][NR_MAX];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) sums[i][j] = vsum(acc[i][j]);
    finish(a, m, n, MR, NR, sums);
}

/* Each (kind, MR, NR) as its own function, so the tiles' loops unroll into registers. */
typedef void (*TileFn)(const Args *, int64_t, int64_t);
#define ROWS_TILE(KIND, MR, NR) \
    static void tile_##KIND##_##MR##x##NR(const Args *a, int64_t m, int64_t n) { tile_rows(KIND, MR, NR, a, m, n); }
#define INT4_TILE(MR, NR) \
    static void tile_int4_##MR##x##NR(const Args *a, int64_t m, int64_t n) { tile_int4(MR, NR, a, m, n); }
#define ROWS_TILES(KIND) \
    ROWS_TILE(KIND, 4, 3) ROWS_TILE(KIND, 3, 4) ROWS_TILE(KIND, 2, 6) ROWS_TILE(KIND, 1, 8) ROWS_TILE(KIND, 4, 1) \
    ROWS_TILE(KIND, 3, 1) ROWS_TILE(KIND, 2, 1) ROWS_TILE(KIND, 1, 1)
#if PG_VL == 16
#define WIDE_ROWS_TILES(KIND) ROWS_TILE(KIND, 5, 4) ROWS_TILE(KIND, 6, 3) ROWS_TILE(KIND, 7, 3) ROWS_TILE(KIND, 8, 3) \
    ROWS_TILE(KIND, 5, 1) ROWS_TILE(KIND, 6, 1) ROWS_TILE(KIND, 7, 1) ROWS_TILE(KIND, 8, 1)
#else
#define WIDE_ROWS_TILES(KIND)
#endif
ROWS_TILES(PG_F32) WIDE_ROWS_TILES(PG_F32)
ROWS_TILES(PG_BF16) WIDE_ROWS_TILES(PG_BF16)
ROWS_TILES(PG_INT8) WIDE_ROWS_TILES(PG_INT8)
INT4_TILE(1, 1) INT4_TILE(2, 1) INT4_TILE(3, 1) INT4_TILE(4, 1) INT4_TILE(5, 1) INT4_TILE(6, 1) INT4_TILE(7, 1)
INT4_TILE(8, 1)
/* Wide tiles use as many registers as there are (AVX-512: 32; AVX2: 16) for the accumulators,
 * the unpacked weights and x: more outputs per tile share each load of x. */
#if PG_VL == 16
INT4_TILE(1, 8) INT4_TILE(2, 4) INT4_TILE(3, 4) INT4_TILE(4, 3) INT4_TILE(5, 2) INT4_TILE(6, 2) INT4_TILE(7, 2) INT4_TILE(8, 2)
#else
INT4_TILE(1, 4) INT4_TILE(2, 3) INT4_TILE(3, 2)
#endif

typedef struct {
    TileFn wide, narrow;  // NR outputs, one output (the last ones)
    int nr;
} Tiles;

/* [kind][rows - 1] for rows of float32 / bfloat16 / int8 weights (up to MR_MAX at once) and
 * for a whole step of int4 (up to INT4_MR_MAX). */
#define NARROW_ROWS(KIND)                                                                   \
    {tile_##KIND##_1x8, tile_##KIND##_1x1, 8}, {tile_##KIND##_2x6, tile_##KIND##_2x1, 6}, \
        {tile_##KIND##_3x4, tile_##KIND##_3x1, 4}, {tile_##KIND##_4x3, tile_##KIND##_4x1, 3}
#if PG_VL == 16
#define ROWS_TABLE(KIND)                                                                   \
    {NARROW_ROWS(KIND), {tile_##KIND##_5x4, tile_##KIND##_5x1, 4},                        \
     {tile_##KIND##_6x3, tile_##KIND##_6x1, 3}, {tile_##KIND##_7x3, tile_##KIND##_7x1, 3}, \
     {tile_##KIND##_8x3, tile_##KIND##_8x1, 3}}
#else
#define ROWS_TABLE(KIND) {NARROW_ROWS(KIND)}
#endif
static const Tiles ROW_TILES[3][MR_MAX] = {ROWS_TABLE(PG_F32), ROWS_TABLE(PG_BF16), ROWS_TABLE(PG_INT8)};
static const Tiles INT4_TILES[INT4_MR_MAX] = {
#if PG_VL == 16
    {tile_int4_1x8, tile_int4_1x1, 8}, {tile_int4_2x4, tile_int4_2x1, 4}, {tile_int4_3x4, tile_int4_3x1, 4},
    {tile_int4_4x3, tile_int4_4x1, 3}, {tile_int4_5x2, tile_int4_5x1, 2}, {tile_int4_6x2, tile_int4_6x1, 2},
    {tile_int4_7x2, tile_int4_7x1, 2}, {tile_int4_8x2, tile_int4_8x1, 2},
#else
    {tile_int4_1x4, tile_int4_1x1, 4}, {tile_int4_2x3, tile_int4_2x1, 3}, {tile_int4_3x2, tile_int4_3x1, 2},
    {tile_int4_4x1, tile_int4_4x1, 1}, {tile_int4_5x1, tile_int4_5x1, 1}, {tile_int4_6x1, tile_int4_6x1, 1},
    {tile_int4_7x1, tile_int4_7x1, 1}, {tile_int4_8x1, tile_int4_8x1, 1},
#endif
};

#define N_BLOCK 24  // outputs whose weights are read once for a block of rows
#define TASK_OUTPUTS (2 * N_BLOCK)  // outputs per task of the thread pool

/* Outputs [n0, n_end) of rows [m0, m_end) with `tiles` (indexed by the rows of a tile - 1). */
static void run_block(const Args *a, const Tiles *tiles, int mr_max, int64_t m0, int64_t m_end, int64_t n0,
                      int64_t n_end) {
    for (int64_t m = m0; m < m_end; m += mr_max) {
        int64_t rows = m_end - m < mr_max ? m_end - m : mr_max;
        const Tiles *t = &tiles[rows - 1];
        int64_t n = n0;
        for (; n + t->nr <= n_end; n += t->nr) t->wide(a, m, n);
        for (; n < n_end; n++) t->narrow(a, m, n);
    }
}

/* Rows per block: a block of rows stays in cache while each block of weights is read once for it. */
static int64_t row_block(const Args *a) {
    int64_t rows = (128 * 1024 / 4) / (a->K > 0 ? a->K : 1);
    return rows < MR_MAX ? MR_MAX : rows - rows % MR_MAX;
}

/* Outputs [n_lo, n_hi) of every row. */
static void run_outputs(const Args *a, int64_t n_lo, int64_t n_hi) {
    const int64_t m_block = row_block(a);
    for (int64_t m0 = 0; m0 < a->M; m0 += m_block) {
        int64_t m_end = m0 + m_block < a->M ? m0 + m_block : a->M;
        for (int64_t n0 = n_lo; n0 < n_hi; n0 += N_BLOCK)
            run_block(a, ROW_TILES[a->kind], MR_MAX, m0, m_end, n0, n0 + N_BLOCK < n_hi ? n0 + N_BLOCK : n_hi);
    }
}

/* int4 outputs [n_lo, n_hi) of a prompt's many rows: each block of N_BLOCK rows of the weight is
 * unpacked once into a float32 panel that every row then reads (`tile_rows`). */
static void run_int4_panels(const Args *a, int64_t n_lo, int64_t n_hi) {
    const int64_t K = a->K, m_block = row_block(a);
    float *panel = pg_scratch(1, N_BLOCK * K);
    for (int64_t n0 = n_lo; n0 < n_hi; n0 += N_BLOCK) {
        int64_t n_end = n0 + N_BLOCK < n_hi ? n0 + N_BLOCK : n_hi;
        for (int64_t n = n0; n < n_end; n++) {
            const uint8_t *row = (const uint8_t *)a->w + n * (K / 2);
            for (int64_t g = 0; g < K / INT4_GROUP; g++) {
                vf scale, zero, low, high;
                int4_group_scales(a, 1, g, n, &scale, &zero);
                for (int h = 0; h < INT4_HALVES; h++) {
                    int4_weights(row, g, h, scale, zero, &low, &high);
                    float *at = panel + (n - n0) * K + g * INT4_GROUP + 2 * h * PG_VL;  // unpack order, as x
                    vstore(at, low);
                    vstore(at + PG_VL, high);
                }
            }
        }
        Args unpacked = *a;
        unpacked.kind = PG_F32;
        unpacked.w = panel - n0 * K;  // row n of the weight is row n - n0 of the panel
        for (int64_t m0 = 0; m0 < a->M; m0 += m_block)
            run_block(&unpacked, ROW_TILES[PG_F32], MR_MAX, m0, m0 + m_block < a->M ? m0 + m_block : a->M, n0, n_end);
    }
}

static void run_range(const Args *a, int64_t n_lo, int64_t n_hi) {
    if (a->kind != PG_INT4) run_outputs(a, n_lo, n_hi);
    else if (a->M < INT4_PANEL_ROWS) run_block(a, INT4_TILES, INT4_MR_MAX, 0, a->M, n_lo, n_hi);
    else run_int4_panels(a, n_lo, n_hi);
}

static inline vf load_x(const void *x, int x_bf16, int64_t i) {
    return x_bf16 ? vload_bf16((const uint16_t *)x + i) : vload((const float *)x + i);
}

/* x widened to float32 in a buffer of the calling thread, kept for its next call; for int4
 * weights, each group of 32 in unpack order (`int4_natural`). */
static const float *as_f32(const void *x, int x_bf16, int64_t count, int kind) {
    if (!x_bf16 && kind != PG_INT4) return (const float *)x;
    float *buffer = pg_scratch(0, count);
    if (kind == PG_INT4) {  // K is a multiple of the group size
        for (int64_t g = 0; g < count; g += INT4_GROUP)
            for (int v = 0; v < INT4_GROUP / PG_VL; v++)
                vstore(buffer + g + v * PG_VL, load_x(x, x_bf16, g + int4_natural(v) * PG_VL));
        return buffer;
    }
    int64_t i = 0;
    for (; i + PG_VL <= count; i += PG_VL) vstore(buffer + i, load_x(x, 1, i));
    for (; i < count; i++) buffer[i] = load_at(x, 1, i);
    return buffer;
}

/* One task: a range of N_BLOCK-aligned outputs (whole tiles, so only the last range has narrow ones). */
static void run_task(void *ctx, int64_t task) {
    const Args *a = (const Args *)ctx;
    int64_t lo = task * TASK_OUTPUTS, hi = lo + TASK_OUTPUTS < a->N ? lo + TASK_OUTPUTS : a->N;
    run_range(a, lo, hi);
}

int pg_matmul_amx(const void *x, int64_t M, int64_t K, int kind, const void *w, const void *scales,
                  int scales_bf16, int64_t N, const void *bias, int bias_bf16, void *out, int out_bf16,
                  int num_threads);
int pg_matmul_avx512bf16(const void *x, int64_t M, int64_t K, int kind, const void *w, const void *scales,
                         int scales_bf16, int64_t N, const void *bias, int bias_bf16, void *out, int out_bf16,
                         int num_threads);

void pg_matmul(const void *x, int x_bf16, int64_t M, int64_t K, int kind, const void *w, const void *scales,
               int scales_bf16, int64_t N, const void *bias, int bias_bf16, void *out, int out_bf16,
               int num_threads) {
    // bfloat16 x on AMX tiles where this CPU has them (matmul_amx.c; its choice never depends on M)
    if (x_bf16 && pg_matmul_amx(x, M, K, kind, w, scales, scales_bf16, N, bias, bias_bf16, out, out_bf16, num_threads))
        return;
    // else int8 and int4 weights on AVX512-BF16 dot products where this CPU has them (matmul_avx512bf16.c)
    if (x_bf16 && pg_matmul_avx512bf16(x, M, K, kind, w, scales, scales_bf16, N, bias, bias_bf16, out, out_bf16,
                                       num_threads))
        return;
    Args a = {as_f32(x, x_bf16, M * K, kind), M, K, N, kind, w, scales, bias, scales_bf16, bias_bf16, out, out_bf16};
    if (M * N * K < 65536) num_threads = 1;  // waking a helper costs more than such a product
    pg_parallel(num_threads, (N + TASK_OUTPUTS - 1) / TASK_OUTPUTS, run_task, &a);
}
