/* Matrix products with bfloat16 x on AMX tiles (Intel Sapphire Rapids and later), for matmul.c:
 * out (M, N) = x (M, K) @ w (N, K)^T (+ bias), w bfloat16, int8 or int4 (matmul.c's formats),
 * out float32 or bfloat16. Called first by `pg_matmul`; it declines (returns 0) where AMX is
 * absent, the kernel refused the tile permission, or the shape does not fit (K % 32, N % 16):
 * the choice depends on the weight, x's dtype and the CPU only, never on M, so a weight is
 * always multiplied on one path.
 *
 * Why: the vector kernels (matmul.c) make ~150 GFLOP/s on two cores and a step of 8 rows costs
 * 2.6x one row. One tile instruction (`tdpbf16ps`) does 16 x 16 x 32 multiply-adds: 8 rows cost
 * what one does (the weights' reading) and a prompt runs ~1 TFLOP/s per core.
 *
 * Batch invariance holds as in matmul.c: an output element is one float32 accumulator that
 * `tdpbf16ps` adds the products of k = 0, 1, 2, ... into in order (32 per instruction), then
 * (int8) the channel's scale, the bias, one rounding; which rows share a tile, how many there
 * are and which thread runs it never enter. (AMX reads bfloat16 subnormals as zero and flushes
 * float32 ones: one rule for every row.)
 *
 * Quantized weights become bfloat16 tiles exactly: int8 codes and int4's q - 8 are small
 * integers. int8: a task's 32 weight rows are widened once into a bfloat16 panel, then
 * multiplied as bfloat16 ones, the scale applied to the sum. int4 (w = (q - 8) * scale + zero
 * per group of 32 k, one tile's depth): per group, S = sum x (q - 8) on the tile, then
 * acc = fma(S, scale, acc) and acc = fma(sum x, zero, acc), groups in order; sum x per row and
 * group is added once per call (`pack_x`). Rounding the dequantized weights to bfloat16 would
 * have cost int4 precision; this way each product is exact and only the sums round.
 *
 * Layout. The weight is the tiles' A operand as it is stored: 16 outputs x 32 k per tile, a row
 * stride of K. x is the B operand, which AMX wants as pairs: per block of 16 rows and chunk of 32
 * k, a tile whose row p holds each row's pair (k = 2p, 2p + 1), that is the 16 x 16 transpose of
 * the block's 32-bit pairs (`pack_x`, once per call). The accumulators come out transposed (16
 * outputs x 16 rows) and are transposed back as they are written.
 */
#include <stdint.h>
#include <string.h>

#include "simd.h"
#include "threads.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__AVX512BW__) && \
    defined(__linux__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define TILE_K 32         // bfloat16 values of k per tile row (64 bytes)
#define TILE_BYTES 1024   // 16 rows x 64 bytes
#define TASK_OUTPUTS 32   // two A tiles of weights

static int amx_state;  // 0: not asked yet, 1: usable, -1: not here
static int amx_on = 1;

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

/* Linux hands out the tile registers' state only to a process that asks (5.16 and later). */
static int amx_usable(void) {
    if (amx_state == 0) amx_state = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 1 : -1;
    return amx_state == 1 && amx_on;
}

/* Every tile 16 rows x 64 bytes. Loaded by each task: the configuration is per thread and torch's
 * own AMX kernels (oneDNN) may have loaded another one on the calling thread in between. */
static void load_tile_config(void) {
    TileConfig config;
    memset(&config, 0, sizeof config);
    config.palette = 1;
    for (int t = 0; t < 8; t++) {
        config.rows[t] = 16;
        config.colsb[t] = 64;
    }
    _tile_loadconfig(&config);
}

/* r[i] := column i of the 16 x 16 matrix of 32-bit values whose rows were r[0..15]. */
static inline void transpose16(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 4; i++) {
            t[8 * h + i] = _mm512_shuffle_i32x4(u[8 * h + i], u[8 * h + 4 + i], 0x88);
            t[8 * h + 4 + i] = _mm512_shuffle_i32x4(u[8 * h + i], u[8 * h + 4 + i], 0xdd);
        }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[8 + i], 0x88);
        r[8 + i] = _mm512_shuffle_i32x4(t[i], t[8 + i], 0xdd);
    }
}

/* The 32 bfloat16 of a 64-byte row added in float32: its two halves lane by lane, then the
 * lanes in a fixed tree (the same for every row). */
static inline float row_sum(__m512i row) {
    __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(row, 16));
    __m512 odd = _mm512_castsi512_ps(_mm512_and_si512(row, _mm512_set1_epi32((int)0xffff0000u)));
    float lanes[16];
    _mm512_storeu_ps(lanes, _mm512_add_ps(even, odd));
    for (int width = 8; width > 0; width /= 2)
        for (int i = 0; i < width; i++) lanes[i] += lanes[i + width];
    return lanes[0];
}

/* x (M, K) as B tiles: block b of 16 rows, chunk c of 32 k at tile (b * K / 32 + c); rows past M
 * are 0. With `sums`, also each row's sum over each chunk at sums[(b * K / 32 + c) * 16 + row]. */
static void pack_x(const uint16_t *x, int64_t M, int64_t K, uint16_t *packed, float *sums) {
    const int64_t num_chunks = K / TILE_K;
    for (int64_t m0 = 0; m0 < M; m0 += 16) {
        const int rows = M - m0 < 16 ? (int)(M - m0) : 16;
        for (int64_t c = 0; c < num_chunks; c++) {
            __m512i r[16];
            for (int i = 0; i < 16; i++)
                r[i] = i < rows ? _mm512_loadu_si512(x + (m0 + i) * K + c * TILE_K) : _mm512_setzero_si512();
            if (sums)
                for (int i = 0; i < 16; i++) sums[((m0 / 16) * num_chunks + c) * 16 + i] = row_sum(r[i]);
            transpose16(r);
            uint16_t *tile = packed + ((m0 / 16) * num_chunks + c) * (TILE_BYTES / 2);
            for (int p = 0; p < 16; p++) _mm512_storeu_si512(tile + p * TILE_K, r[p]);
        }
    }
}

enum { AMX_BF16 = 1, AMX_INT8 = 2, AMX_INT4 = 3 };  // matmul.c's PG_BF16, PG_INT8, PG_INT4

typedef struct {
    const uint16_t *packed;  // x as B tiles
    const float *x_sums;     // int4: x's sums per row and group (`pack_x`)
    int kind;
    const void *w;  // bf16 (N, K); int8 (N, K); int4 (N, K / 2)
    int64_t M, K, N;
    const void *scales, *bias;  // int8 (N,); int4 (K / 32, N, 2): (scale, zero)
    int scales_bf16, bias_bf16;
    void *out;
    int out_bf16;
} AmxArgs;

static inline __m512 load16(const void *p, int is_bf16, int64_t at) {
    if (!is_bf16) return _mm512_loadu_ps((const float *)p + at);
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)((const uint16_t *)p + at))), 16));
}

/* float32 -> bfloat16, round to nearest even, a NaN kept a quiet NaN (matmul.c's `store_at`). */
static inline __m256i to_bf16(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i one = _mm512_set1_epi32(1);
    __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), _mm512_and_si512(_mm512_srli_epi32(u, 16), one)), 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

/* The 16 x 16 accumulator `sums` (outputs n.., rows m..) transposed into out, with (int8) the
 * channels' scales and the bias. */
static void write_out(const AmxArgs *a, const float sums[16][16], int64_t m0, int64_t n0) {
    __m512i r[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(sums[i]);
    transpose16(r);
    const __m512 scale = a->kind == AMX_INT8 ? load16(a->scales, a->scales_bf16, n0) : _mm512_setzero_ps();
    const __m512 bias = a->bias ? load16(a->bias, a->bias_bf16, n0) : _mm512_setzero_ps();
    const int rows = a->M - m0 < 16 ? (int)(a->M - m0) : 16;
    for (int m = 0; m < rows; m++) {
        __m512 v = _mm512_castsi512_ps(r[m]);
        if (a->kind == AMX_INT8) v = _mm512_mul_ps(v, scale);
        if (a->bias) v = _mm512_add_ps(v, bias);
        if (a->out_bf16) _mm256_storeu_si256((void *)((uint16_t *)a->out + (m0 + m) * a->N + n0), to_bf16(v));
        else _mm512_storeu_ps((float *)a->out + (m0 + m) * a->N + n0, v);
    }
}

/* Outputs n, n + 16 of rows m0.. (two blocks of 16 when `two_blocks`) of the bfloat16 weight w
 * (N, K): each weight tile read once per chunk for both blocks. Tiles 0-3 accumulate, 4-5 hold
 * weights, 6-7 x. */
static void tiles_2x2(const AmxArgs *a, const uint16_t *w, int64_t n, int64_t m0, int two_blocks) {
    const int64_t num_chunks = a->K / TILE_K, stride = a->K * 2;
    const uint16_t *w0 = w + n * a->K, *w1 = w0 + 16 * a->K;
    const uint16_t *x0 = a->packed + (m0 / 16) * num_chunks * (TILE_BYTES / 2), *x1 = x0 + num_chunks * (TILE_BYTES / 2);
    float sums[16][16] __attribute__((aligned(64)));
    _tile_zero(0);
    _tile_zero(1);
    if (two_blocks) {
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t c = 0; c < num_chunks; c++) {
            _tile_loadd(4, w0 + c * TILE_K, stride);
            _tile_loadd(5, w1 + c * TILE_K, stride);
            _tile_loadd(6, x0 + c * (TILE_BYTES / 2), 64);
            _tile_loadd(7, x1 + c * (TILE_BYTES / 2), 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 5, 6);
            _tile_dpbf16ps(2, 4, 7);
            _tile_dpbf16ps(3, 5, 7);
        }
    } else
        for (int64_t c = 0; c < num_chunks; c++) {
            _tile_loadd(6, x0 + c * (TILE_BYTES / 2), 64);
            _tile_loadd(4, w0 + c * TILE_K, stride);
            _tile_loadd(5, w1 + c * TILE_K, stride);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 5, 6);
        }
    _tile_stored(0, sums, 64);
    write_out(a, sums, m0, n);
    _tile_stored(1, sums, 64);
    write_out(a, sums, m0, n + 16);
    if (two_blocks) {
        _tile_stored(2, sums, 64);
        write_out(a, sums, m0 + 16, n);
        _tile_stored(3, sums, 64);
        write_out(a, sums, m0 + 16, n + 16);
    }
}

/* Outputs n..n+15 of rows m0..m0+15: the last 16 of an N that is not a multiple of 32. */
static void tiles_1x1(const AmxArgs *a, const uint16_t *w, int64_t n, int64_t m0) {
    const int64_t num_chunks = a->K / TILE_K;
    const uint16_t *w0 = w + n * a->K, *x0 = a->packed + (m0 / 16) * num_chunks * (TILE_BYTES / 2);
    float sums[16][16] __attribute__((aligned(64)));
    _tile_zero(0);
    for (int64_t c = 0; c < num_chunks; c++) {
        _tile_loadd(6, x0 + c * (TILE_BYTES / 2), 64);
        _tile_loadd(4, w0 + c * TILE_K, a->K * 2);
        _tile_dpbf16ps(0, 4, 6);
    }
    _tile_stored(0, sums, 64);
    write_out(a, sums, m0, n);
}

/* The int8 codes of weight rows [n, n_end) as bfloat16 rows of a panel (exact: |code| <= 127). */
static void widen_int8(const AmxArgs *a, int64_t n, int64_t n_end, uint16_t *panel) {
    const int8_t *codes = (const int8_t *)a->w;
    for (int64_t row = n; row < n_end; row++)
        for (int64_t k = 0; k < a->K; k += 32)
            _mm512_storeu_si512(panel + (row - n) * a->K + k, vbf16_from_i8(codes + row * a->K + k));
}

/* Outputs [n, n_end) of every row of a bfloat16 weight w (N, K). */
static void run_bf16(const AmxArgs *a, const uint16_t *w, int64_t n, int64_t n_end) {
    for (int64_t m0 = 0; m0 < a->M;) {
        if (n + 32 <= n_end) {
            const int two_blocks = a->M - m0 > 16;
            tiles_2x2(a, w, n, m0, two_blocks);
            m0 += two_blocks ? 32 : 16;
        } else {
            tiles_1x1(a, w, n, m0);
            m0 += 16;
        }
    }
}

/* `tile` (an A operand) := group g of int4 weight rows n..n+15 as bfloat16 q - 8. */
static void int4_tile(const AmxArgs *a, int64_t n, int64_t g, uint16_t *tile) {
    const uint8_t *packed = (const uint8_t *)a->w;
    const __m512 q_minus_8 = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    const __m512i levels = (__m512i)_mm512_cvtne2ps_pbh(q_minus_8, q_minus_8);  // bfloat16 q - 8 at q
    for (int i = 0; i < 16; i++) {
        __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128((const void *)(packed + (n + i) * (a->K / 2) + g * 16)));
        __m256i low = _mm256_and_si256(bytes, _mm256_set1_epi16(15)), high = _mm256_srli_epi16(bytes, 4);
        __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);  // k 0-15: low nibbles, 16-31: high
        _mm512_storeu_si512(tile + i * TILE_K, _mm512_permutexvar_epi16(q, levels));
    }
}

/* Outputs [n, n_end) (16 or 32) of every row of an int4 weight. For each group (one tile's depth):
 * S = x . (q - 8) on the tiles, then acc = fma(S, scale, acc), acc = fma(sum x, zero, acc). The
 * accumulators (16 outputs x 16 rows per block) wait in `acc` between groups. */
static void run_int4(const AmxArgs *a, int64_t n, int64_t n_end, float *acc) {
    const int64_t num_groups = a->K / TILE_K, num_blocks = (a->M + 15) / 16;
    const int num_tiles = (int)((n_end - n) / 16);
    uint16_t tiles[2][16 * TILE_K] __attribute__((aligned(64)));
    float sums[16][16] __attribute__((aligned(64)));
    memset(acc, 0, (size_t)num_blocks * num_tiles * 256 * sizeof(float));
    for (int64_t g = 0; g < num_groups; g++) {
        for (int t = 0; t < num_tiles; t++) int4_tile(a, n + 16 * t, g, tiles[t]);
        float scale_zero[2][32];
        for (int t = 0; t < num_tiles; t++) {
            const int64_t at = (g * a->N + n + 16 * t) * 2;
            _mm512_storeu_ps(scale_zero[t], load16(a->scales, a->scales_bf16, at));
            _mm512_storeu_ps(scale_zero[t] + 16, load16(a->scales, a->scales_bf16, at + 16));
        }
        _tile_loadd(4, tiles[0], 64);
        if (num_tiles == 2) _tile_loadd(5, tiles[1], 64);
        for (int64_t b = 0; b < num_blocks; b++) {
            _tile_loadd(6, a->packed + (b * num_groups + g) * (TILE_BYTES / 2), 64);
            const __m512 x_sums = _mm512_loadu_ps(a->x_sums + (b * num_groups + g) * 16);
            for (int t = 0; t < num_tiles; t++) {
                if (t == 0) {
                    _tile_zero(0);
                    _tile_dpbf16ps(0, 4, 6);
                    _tile_stored(0, sums, 64);
                } else {
                    _tile_zero(1);
                    _tile_dpbf16ps(1, 5, 6);
                    _tile_stored(1, sums, 64);
                }
                float *block = acc + (b * num_tiles + t) * 256;
                for (int i = 0; i < 16; i++) {
                    __m512 v = _mm512_loadu_ps(block + 16 * i);
                    v = _mm512_fmadd_ps(_mm512_loadu_ps(sums[i]), _mm512_set1_ps(scale_zero[t][2 * i]), v);
                    v = _mm512_fmadd_ps(x_sums, _mm512_set1_ps(scale_zero[t][2 * i + 1]), v);
                    _mm512_storeu_ps(block + 16 * i, v);
                }
            }
        }
    }
    for (int64_t b = 0; b < num_blocks; b++)
        for (int t = 0; t < num_tiles; t++) write_out(a, (const float(*)[16])(acc + (b * num_tiles + t) * 256), 16 * b, n + 16 * t);
}

/* One task: outputs [32 task, 32 task + 32) of every row (its weights stay in cache across rows). */
static void run_amx_task(void *ctx, int64_t task) {
    const AmxArgs *a = (const AmxArgs *)ctx;
    const int64_t n = task * TASK_OUTPUTS, n_end = n + TASK_OUTPUTS < a->N ? n + TASK_OUTPUTS : a->N;
    load_tile_config();
    if (a->kind == AMX_BF16) run_bf16(a, (const uint16_t *)a->w, n, n_end);
    else if (a->kind == AMX_INT8) {
        uint16_t *panel = (uint16_t *)pg_scratch(1, TASK_OUTPUTS * a->K / 2);
        widen_int8(a, n, n_end, panel);
        run_bf16(a, panel - n * a->K, n, n_end);  // row n of the weight is the panel's first
    } else run_int4(a, n, n_end, pg_scratch(1, (a->M + 15) / 16 * 2 * 256));
    _tile_release();
}

int pg_matmul_amx(const void *x, int64_t M, int64_t K, int kind, const void *w, const void *scales,
                  int scales_bf16, int64_t N, const void *bias, int bias_bf16, void *out, int out_bf16,
                  int num_threads) {
    if (kind < AMX_BF16 || K % TILE_K || N % 16 || !amx_usable()) return 0;
    const int64_t num_blocks = (M + 15) / 16;
    uint16_t *packed = (uint16_t *)pg_scratch(0, num_blocks * (K / TILE_K) * (TILE_BYTES / 4));
    float *x_sums = kind == AMX_INT4 ? pg_scratch(2, num_blocks * (K / TILE_K) * 16) : NULL;
    pack_x((const uint16_t *)x, M, K, packed, x_sums);
    AmxArgs a = {packed, x_sums, kind, w, M, K, N, scales, bias, scales_bf16, bias_bf16, out, out_bf16};
    if (M * N * K < 65536) num_threads = 1;  // waking a helper costs more than such a product
    pg_parallel(num_threads, (N + TASK_OUTPUTS - 1) / TASK_OUTPUTS, run_amx_task, &a);
    return 1;
}

/* 1 where bfloat16 products run on AMX tiles in this process; `on` 0/1 switches them (the
 * benchmarks' comparison), -1 only asks. */
int pg_amx(int on) {
    if (on >= 0) amx_on = on;
    return amx_usable();
}

#else

int pg_matmul_amx(const void *x, int64_t M, int64_t K, int kind, const void *w, const void *scales,
                  int scales_bf16, int64_t N, const void *bias, int bias_bf16, void *out, int out_bf16,
                  int num_threads) {
    (void)x, (void)M, (void)K, (void)kind, (void)w, (void)scales, (void)scales_bf16, (void)N, (void)bias,
        (void)bias_bf16, (void)out, (void)out_bf16, (void)num_threads;
    return 0;
}

int pg_amx(int on) {
    (void)on;
    return 0;
}

#endif
