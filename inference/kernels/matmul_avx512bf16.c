/* Matrix products with bfloat16 x on AVX512-BF16 dot products (`vdpbf16ps`), for CPUs that have
 * them and no AMX (AMD Zen 4 and later, Intel Cooper Lake): out (M, N) = x (M, K) @ w (N, K)^T
 * (+ bias) for bfloat16, int8 and int4 weights (matmul.c's formats), out float32 or bfloat16.
 * `pg_matmul` calls it once matmul_amx.c has declined; it declines in turn (returns 0) without
 * the instructions, for float32 weights, or where K % 32: the choice depends on the weight, x's
 * dtype and the CPU only, never on M, so a weight is always multiplied on one path.
 *
 * Why: on the float32 vector path (matmul.c) each row costs a fused multiply-add per 16 weights
 * besides the weights' widening or unpacking, so on the EPYC a decode step of 8 int4 rows cost
 * ~3.5x one. One `vdpbf16ps` does 32 multiply-adds on bfloat16 as they are stored: each 32
 * weights are unpacked once for all the call's rows (into registers for a step's few rows, into
 * a panel for a prompt's) and a row then costs one instruction per 32 of them. (On the Xeon,
 * which has AMX, `vdpbf16ps` had measured slower than its two FMA ports; AMX goes first there.)
 *
 * Readings. int8 codes are exact in bfloat16 (|code| <= 127): each product is exact and the
 * channel's scale multiplies the sum, as on the other paths. int4: each weight
 * (q - 8) * scale + zero is computed in float32 as on the vector path, then rounded once to
 * bfloat16 (a relative 2^-9, against int4's own step of a group's range / 15). The AMX path
 * keeps those products exact by scaling each group's sum; here that would be a second
 * instruction per row and group, which is what batching has to save.
 *
 * Batch invariance as in matmul.c: lane l of an output's float32 accumulator adds, for each 32 k
 * in order, `vdpbf16ps`'s products of k = 2l and 2l + 1; then the lanes in the fixed tree
 * (`vsum`), the int8 scale, the bias, one rounding. Which rows share a tile, how many there are
 * and which thread runs it never enter. (`vdpbf16ps` reads bfloat16 subnormals as zero and
 * flushes float32 ones: one rule for every row.)
 */
#include "simd.h"
#include "threads.h"

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && PG_VL == 16

enum { DP_BF16 = 1, DP_INT8 = 2, DP_INT4 = 3 };  // matmul.c's PG_BF16, PG_INT8, PG_INT4
#define DP_K 32            // k per instruction: 32 bfloat16 in a 512-bit register
#define PANEL_OUTPUTS 24  // outputs unpacked together; every tile width below divides it
/* Outputs per task of the thread pool: 4 panels, ~27 KB of a 576-wide int4 weight, contiguous.
 * With one panel per task the two threads' reads jumped every ~7 KB and a decode step's int4
 * products waited on memory: 6.2-6.9 ms against 4.3-5.1 (one row, 30 layers, interleaved A/B). */
#define TASK_OUTPUTS (4 * PANEL_OUTPUTS)
#define MR_MAX 8
#define NR_MAX 8

static int dp_on = 1;

typedef struct {
    const uint16_t *x;  // (M, K) bfloat16
    int64_t M, K, N;
    int kind;
    const void *w, *scales, *bias;
    int scales_bf16, bias_bf16;
    void *out;  // (M, N)
    int out_bf16;
} DpArgs;

/* Group g (32 k) of int4 weight row n as bfloat16 in k order. Each weight is looked up in a
 * table of the group's 16 values (q - 8) * scale + zero, computed in float32 and rounded once.
 * Words 0-15 of the index are the group's bytes (k 0-15 in their low nibbles: `vpermw` reads 5
 * bits of an index, so the table is repeated at 16-31 and the high nibble's bit drops out),
 * words 16-31 the same bytes shifted right by 4 (k 16-31). */
PG_INLINE __m512i int4_group(const DpArgs *a, int64_t n, int64_t g) {
    const __m512 levels = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    const __m512i shifts = _mm512_set_epi64(0x0004000400040004, 0x0004000400040004, 0x0004000400040004,
                                            0x0004000400040004, 0, 0, 0, 0);
    const uint8_t *bytes = (const uint8_t *)a->w + n * (a->K / 2) + g * (DP_K / 2);
    __m512i index = _mm512_cvtepu8_epi16(_mm256_broadcastsi128_si256(_mm_loadu_si128((const void *)bytes)));
    index = _mm512_srlv_epi16(index, shifts);
    const int64_t at = (g * a->N + n) * 2;
    __m512 scale, zero;
    if (a->scales_bf16) {  // the (scale, zero) pair in every lane, each bfloat16 widened in place
        int32_t pair;      // (one load: per group, this was a third of one row's product)
        memcpy(&pair, (const uint16_t *)a->scales + at, sizeof pair);
        const __m512i pairs = _mm512_set1_epi32(pair);
        scale = _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
        zero = _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32((int32_t)0xffff0000u)));
    } else {
        scale = _mm512_set1_ps(((const float *)a->scales)[at]);
        zero = _mm512_set1_ps(((const float *)a->scales)[at + 1]);
    }
    const __m512 values = _mm512_fmadd_ps(levels, scale, zero);
    return _mm512_permutexvar_epi16(index, (__m512i)_mm512_cvtne2ps_pbh(values, values));
}

/* Weights k..k+31 of row n as bfloat16. */
PG_INLINE __m512i unpack(const int kind, const DpArgs *a, int64_t n, int64_t k) {
    if (kind == DP_BF16) return _mm512_loadu_si512((const uint16_t *)a->w + n * a->K + k);
    return kind == DP_INT4 ? int4_group(a, n, k / DP_K) : vbf16_from_i8((const int8_t *)a->w + n * a->K + k);
}

/* Prefetches, in a step's tiles (up to 8 rows, weights unpacked in registers), the weights the
 * tile PREFETCH_TILES ahead will read at the same k, a 64-byte line at a time, and an int4
 * group's (scale, zero) pairs. Such a tile reads NR weight rows K apart, each once, from memory;
 * left to the hardware prefetcher, 8 rows' bfloat16 output layer (57 MB) ran at half the speed
 * of one row's, waiting on memory between bursts of compute (2.6 against 1.3-1.6 ms; int4 layers
 * ~20% faster too). One row (the 1x8 tile) streams at memory speed already and is left alone. */
#define PREFETCH_TILES 2
PG_INLINE void prefetch_ahead(const int kind, const int NR, const DpArgs *a, int64_t n, int64_t k) {
    const int64_t steps_per_line = kind == DP_BF16 ? 1 : kind == DP_INT8 ? 2 : 4;  // 64 bytes of a row
    const int64_t ahead = n + PREFETCH_TILES * NR;
    if (ahead + NR > a->N) return;
    if (kind == DP_INT4)  // the group's (scale, zero) pairs of the outputs ahead: 16 or 8 outputs a line
        _mm_prefetch((const char *)a->scales + ((k / DP_K) * a->N + ahead) * 2 * (a->scales_bf16 ? 2 : 4),
                     _MM_HINT_T0);
    if ((k / DP_K) % steps_per_line) return;
    for (int j = 0; j < NR; j++) {
        const int64_t row = ahead + j;
        const char *line = kind == DP_BF16   ? (const char *)((const uint16_t *)a->w + row * a->K + k)
                           : kind == DP_INT8 ? (const char *)a->w + row * a->K + k
                                             : (const char *)a->w + row * (a->K / 2) + k / 2;
        _mm_prefetch(line, _MM_HINT_T0);
    }
}

/* Weight rows [n0, n_end) as bfloat16 rows of `panel` (K each), 32 k of every row at a time:
 * int4's (scale, zero) pairs are stored by group, the panel's outputs' side by side. */
PG_INLINE void unpack_rows(const int kind, const DpArgs *a, int64_t n0, int64_t n_end, uint16_t *panel) {
    for (int64_t k = 0; k < a->K; k += DP_K)
        for (int64_t n = n0; n < n_end; n++) _mm512_storeu_si512(panel + (n - n0) * a->K + k, unpack(kind, a, n, k));
}

static void unpack_panel(const DpArgs *a, int64_t n0, int64_t n_end, uint16_t *panel) {
    if (a->kind == DP_INT4) unpack_rows(DP_INT4, a, n0, n_end, panel);
    else unpack_rows(DP_INT8, a, n0, n_end, panel);
}

/* Rows m..m+MR-1, outputs n..n+NR-1: each 32 k, NR weight registers (unpacked here, or read from
 * a panel whose row p is output n) and one of x per row; then each sum's lanes (`vsum8`: `vsum`'s
 * tree), the int8 scale, the bias, one rounding. The same products in the same order either way. */
PG_INLINE void tile(const int kind, const int MR, const int NR, const DpArgs *a, const uint16_t *panel, int64_t p,
                    int64_t m, int64_t n) {
    const int64_t K = a->K;
    // Every loop over the accumulators unrolled, so they stay in registers (left to itself, gcc
    // kept them in a 4 KB stack array, stored and reloaded around each tile: a tenth of its time).
    __m512 acc[MR_MAX][NR_MAX];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) acc[i][j] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += DP_K) {
        __m512bh w[NR_MAX];
        if (!panel && MR > 1) prefetch_ahead(kind, NR, a, n, k);
        for (int j = 0; j < NR; j++)
            w[j] = (__m512bh)(panel ? _mm512_loadu_si512(panel + (p + j) * K + k) : unpack(kind, a, n + j, k));
        for (int i = 0; i < MR; i++) {
            __m512bh xv = (__m512bh)_mm512_loadu_si512(a->x + (m + i) * K + k);
            for (int j = 0; j < NR; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, w[j]);
        }
    }
    float sums[MR_MAX * NR_MAX + 8];
#pragma GCC unroll 8
    for (int at = 0; at < MR * NR; at += 8) {  // `vsum`'s tree, 8 accumulators at a time
        __m512 eight[8];
#pragma GCC unroll 8
        for (int e = 0; e < 8; e++)
            eight[e] = at + e < MR * NR ? acc[(at + e) / NR][(at + e) % NR] : _mm512_setzero_ps();
        vsum8(eight, sums + at);
    }
    // The int8 scale, the bias, one rounding (`store_at`'s), a row's NR outputs at once: done one
    // output at a time, the rounding's branches took a fifth of a prompt's products.
    const __m512 scale = kind == DP_INT8 ? load_lanes(a->scales, a->scales_bf16, n, NR) : _mm512_setzero_ps();
    const __m512 bias = a->bias ? load_lanes(a->bias, a->bias_bf16, n, NR) : _mm512_setzero_ps();
    for (int i = 0; i < MR; i++) {
        __m512 v = _mm512_maskz_loadu_ps((__mmask16)((1u << NR) - 1), sums + i * NR);
        if (kind == DP_INT8) v = _mm512_mul_ps(v, scale);
        if (a->bias) v = _mm512_add_ps(v, bias);
        store_lanes(a->out, a->out_bf16, (m + i) * a->N + n, v, NR);
    }
}

/* Each (kind, MR, NR) its own function, so the loops unroll into registers: NR as wide as 32
 * registers allow for MR rows (MR * NR accumulators, NR weights, one x), then one output at a
 * time. The weights of a step's few rows are unpacked into registers; a prompt's, once into a
 * panel (`panel` not NULL) that all its rows read. */
typedef void (*TileFn)(const DpArgs *, const uint16_t *, int64_t, int64_t, int64_t);
#define TILE(KIND, MR, NR)                                                                                \
    static void tile_##KIND##_##MR##x##NR(const DpArgs *a, const uint16_t *panel, int64_t p, int64_t m,   \
                                          int64_t n) {                                                    \
        if (panel) tile(KIND, MR, NR, a, panel, p, m, n);                                                 \
        else tile(KIND, MR, NR, a, NULL, p, m, n);                                                        \
    }
#define TILES_OF(KIND)                                                                                    \
    TILE(KIND, 1, 8) TILE(KIND, 2, 8) TILE(KIND, 3, 6) TILE(KIND, 4, 6) TILE(KIND, 5, 4) TILE(KIND, 6, 4) \
    TILE(KIND, 7, 3) TILE(KIND, 8, 3) TILE(KIND, 1, 1) TILE(KIND, 2, 1) TILE(KIND, 3, 1) TILE(KIND, 4, 1)  \
    TILE(KIND, 5, 1) TILE(KIND, 6, 1) TILE(KIND, 7, 1) TILE(KIND, 8, 1)
TILES_OF(DP_BF16) TILES_OF(DP_INT8) TILES_OF(DP_INT4)
typedef struct {
    TileFn wide, narrow;
    int nr;
} Tiles;
#define TABLE(KIND)                                                                                      \
    {{tile_##KIND##_1x8, tile_##KIND##_1x1, 8}, {tile_##KIND##_2x8, tile_##KIND##_2x1, 8},              \
     {tile_##KIND##_3x6, tile_##KIND##_3x1, 6}, {tile_##KIND##_4x6, tile_##KIND##_4x1, 6},              \
     {tile_##KIND##_5x4, tile_##KIND##_5x1, 4}, {tile_##KIND##_6x4, tile_##KIND##_6x1, 4},              \
     {tile_##KIND##_7x3, tile_##KIND##_7x1, 3}, {tile_##KIND##_8x3, tile_##KIND##_8x1, 3}}
static const Tiles TILES[3][MR_MAX] = {TABLE(DP_BF16), TABLE(DP_INT8), TABLE(DP_INT4)};

/* Outputs [n0, n_end) (one panel) of every row. Up to 8 rows (a decode step) unpack the weights
 * in their tiles; more (a prompt) unpack them once into a panel. */
static void run_panel(const DpArgs *a, int64_t n0, int64_t n_end) {
    uint16_t *panel = NULL;
    if (a->M > MR_MAX && a->kind != DP_BF16) {  // bfloat16 weights are their own panel
        panel = (uint16_t *)pg_scratch(1, PANEL_OUTPUTS * a->K / 2);
        unpack_panel(a, n0, n_end, panel);
    }
    const Tiles *tiles = TILES[a->kind - DP_BF16];
    for (int64_t m = 0; m < a->M; m += MR_MAX) {
        const Tiles *t = &tiles[(a->M - m < MR_MAX ? a->M - m : MR_MAX) - 1];
        int64_t n = n0;
        for (; n + t->nr <= n_end; n += t->nr) t->wide(a, panel, n - n0, m, n);
        for (; n < n_end; n++) t->narrow(a, panel, n - n0, m, n);
    }
}

/* One task: outputs [96 task, 96 task + 96), a panel at a time. */
static void run_task(void *ctx, int64_t task) {
    const DpArgs *a = (const DpArgs *)ctx;
    const int64_t end = (task + 1) * TASK_OUTPUTS < a->N ? (task + 1) * TASK_OUTPUTS : a->N;
    for (int64_t n0 = task * TASK_OUTPUTS; n0 < end; n0 += PANEL_OUTPUTS)
        run_panel(a, n0, n0 + PANEL_OUTPUTS < end ? n0 + PANEL_OUTPUTS : end);
}

int pg_matmul_avx512bf16(const void *x, int64_t M, int64_t K, int kind, const void *w, const void *scales,
                         int scales_bf16, int64_t N, const void *bias, int bias_bf16, void *out, int out_bf16,
                         int num_threads) {
    if (!dp_on || kind < DP_BF16 || K % DP_K) return 0;
    DpArgs a = {(const uint16_t *)x, M, K, N, kind, w, scales, bias, scales_bf16, bias_bf16, out, out_bf16};
    if (M * N * K < 65536) num_threads = 1;  // waking a helper costs more than such a product
    pg_parallel(num_threads, (N + TASK_OUTPUTS - 1) / TASK_OUTPUTS, run_task, &a);
    return 1;
}

int pg_amx(int on);

/* 1 where bfloat16, int8 and int4 products with bfloat16 x run here in this process (AMX, where
 * on, goes first: with AMX switched off they come here); `on` 0/1 switches them (the benchmarks'
 * and tests' comparison), -1 only asks. */
int pg_avx512bf16(int on) {
    if (on >= 0) dp_on = on;
    return dp_on && !pg_amx(-1);
}

#else

int pg_matmul_avx512bf16(const void *x, int64_t M, int64_t K, int kind, const void *w, const void *scales,
                         int scales_bf16, int64_t N, const void *bias, int bias_bf16, void *out, int out_bf16,
                         int num_threads) {
    (void)x, (void)M, (void)K, (void)kind, (void)w, (void)scales, (void)scales_bf16, (void)N, (void)bias,
        (void)bias_bf16, (void)out, (void)out_bf16, (void)num_threads;
    return 0;
}

int pg_avx512bf16(int on) {
    (void)on;
    return 0;
}

#endif
