/* Matrix products on a GGUF file's own blocks: out (M, N) = x (M, K) @ w (N, K)^T (+ bias), where
 * each row of w is the file's bytes for that row (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K),
 * read as the file stores them (inference/kernels/cpu.py wraps it; inference/models/quant.py's
 * `BlockWeight` calls it). Formats: blocks.h; a prompt's rows on AMX-INT8 tiles: matmul_blocks_amx.c.
 *
 * Why: decode reads every weight once per token, so the bytes read set its speed; and a CPU
 * multiplies 8-bit integers several times faster than it converts them to floats and multiplies
 * those. So, as llama.cpp does, each row of x is quantized per unit of 32 to int8 with one float
 * scale `dx` (x ~ dx * xq), each unit of the weight is unpacked to its integer codes q
 * (w ~ sw * q + mn), and the product of a unit is sw * dx * sum(q * xq) + mn * dx * sum(xq): one
 * exact integer dot product per unit, a few float operations per 32 weights.
 *
 * The order, whatever M is and whichever path runs (AVX2 `maddubs`, AVX-VNNI / AVX512-VNNI
 * `dpbusd`, AMX-INT8 `tdpbssd`, or plain C), so a row's numbers are the same alone, batched, in a prompt or in a decode
 * step, on every one of these paths:
 *   - the integer sums are exact (|q| <= 128, |xq| <= 127, 32 terms), so how they are added up
 *     does not matter;
 *   - the units of a row go in groups of 8 (256 weights: a K-quant super-block), each group's
 *     sums into an 8-lane float32 accumulator: acc[l] = fma(sum_l, sw_l * dx_l, acc[l]), then
 *     (formats with a minimum) acc[l] = fma(mn_l, xs_l, acc[l]) with xs = dx * sum(xq). Q6_K's
 *     scales cover 16 weights: its group is two such steps over half-units, lane l < 4 holding the
 *     first half of unit l and lane l >= 4 the second half of unit l - 4 (the order the AVX2
 *     horizontal adds produce), units 0-3 then 4-7;
 *   - the lanes are added in one fixed tree (`hsum8`), then the bias, rounded once to out's dtype.
 * Missing units of a row's last group count as sum 0 with scale 0.
 * Must not know: models, layers, GGUF files (only the byte layout of their blocks).
 */
#include "blocks.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__AVX512F__)
/* Loops at 64-byte boundaries: without it, one layout of the by-row decode loop (blocks.h's
 * group_sums_by_row) ran 1.3x slower than the same code aligned (measured on the AVX-512 Xeon;
 * the AVX2 build there was 4% slower with it). */
#pragma GCC optimize("align-loops=64")
#endif

/* Row m of x into q / d / s: d = max|x| / 127, q = round-half-even(x / d) (llama.cpp's Q8_0, with
 * d kept in float32). */
__attribute__((unused)) static void quantize_row(const void *x, int x_bf16, int64_t m, int64_t K, int8_t *q, float *d, float *s, int32_t *b,
                         int64_t units_padded) {
    const int64_t units = K / UNIT;
    for (int64_t u = 0; u < units_padded; u++) {
        if (u >= units) {
            d[u] = s[u] = 0.0f;
            b[u] = 0;
            continue;
        }
        float v[UNIT], amax = 0.0f;
        for (int i = 0; i < UNIT; i++) {
            v[i] = load_at(x, x_bf16, m * K + u * UNIT + i);
            float a = fabsf(v[i]);
            amax = a > amax ? a : amax;
        }
        const float scale = amax / 127.0f, inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
        int sum = 0;
        for (int i = 0; i < UNIT; i++) {
            int c = (int)nearbyintf(v[i] * inverse);
            q[u * UNIT + i] = (int8_t)c;
            sum += c;
        }
        d[u] = scale;
        s[u] = scale * (float)sum;
        b[u] = sum;
    }
}

#if defined(PGB_AVX2)
/* quantize_row on 8 lanes: the same max, the same products, the same rounding (to nearest even). */
static void quantize_row_avx2(const void *x, int x_bf16, int64_t m, int64_t K, int8_t *q, float *d, float *s, int32_t *b,
                              int64_t units_padded) {
    const int64_t units = K / UNIT;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t u = 0; u < units_padded; u++) {
        if (u >= units) {
            d[u] = s[u] = 0.0f;
            b[u] = 0;
            continue;
        }
        __m256 v[4], amax = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            const int64_t at = m * K + u * UNIT + 8 * j;
            if (x_bf16) {
                __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)x + at));
                v[j] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
            } else v[j] = _mm256_loadu_ps((const float *)x + at);
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j]));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float scale = _mm_cvtss_f32(m4) / 127.0f, inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
        const __m256 iv = _mm256_set1_ps(inverse);
        __m256i c[4], sum = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            c[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], iv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            sum = _mm256_add_epi32(sum, c[j]);
        }
        // int32 -> int8 in order: packs interleave 128-bit lanes, the permute undoes it
        __m256i p8 = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
        p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(q + u * UNIT), p8);
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        d[u] = scale;
        b[u] = _mm_cvtsi128_si32(s4);
        s[u] = scale * (float)b[u];
    }
}
#define quantize_row quantize_row_avx2
#endif

/* ---- the float side, one lane at a time (every path's order) ---- */

#if !defined(PGB_AVX2)
/* Rows m .. m + MR - 1 of x times weight row n, in plain C. */
static void tile(const Args *a, int64_t m, int MR, int64_t n) {
    const int64_t units = a->K / UNIT, groups = (units + GROUP - 1) / GROUP;
    const uint8_t *row = a->w + n * a->row_bytes;
    const int type = a->type, minimum = has_min(type);
    Acc acc[MR_MAX];
    memset(acc, 0, sizeof(acc));
    for (int64_t g = 0; g < groups; g++) {
        const int count = units - g * GROUP < GROUP ? (int)(units - g * GROUP) : GROUP;
        GroupScales s;
        group_scales(type, row, g, count, &s);
        for (int i = 0; i < MR; i++) {
            int32_t first[8], second[8];
            group_sums_c(type, row, g, count, a->x.q + (m + i) * a->K, first, second);
            const float *dx = a->x.d + (m + i) * a->x.units_padded + g * GROUP;
            const float *xs = a->x.s + (m + i) * a->x.units_padded + g * GROUP;
            if (type == Q6_K) {
                float d0[8], d1[8];
                q6k_dx(dx, d0);
                q6k_dx(dx + 4, d1);
                acc_step(&acc[i], first, s.sw, d0);
                acc_step(&acc[i], second, s.sw + 8, d1);
            } else {
                acc_step(&acc[i], first, s.sw, dx);
                if (minimum) acc_min(&acc[i], s.mn, xs);
            }
        }
    }
    for (int i = 0; i < MR; i++) store(a, m + i, n, hsum8(&acc[i]));
}

static void run_rows(const Args *a, int64_t n_lo, int64_t n_hi) {
    for (int64_t m = 0; m < a->M; m += MR_MAX) {
        const int MR = a->M - m < MR_MAX ? (int)(a->M - m) : MR_MAX;
        for (int64_t n = n_lo; n < n_hi; n++) tile(a, m, MR, n);
    }
}
#else
PG_INLINE float hsum8_avx2(__m256 v) {  // hsum8's tree
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* One row's float step for a group's sums `first` (not Q6_K): the products' share, then the minimum's. */
PG_INLINE __m256 unit_step(const int type, __m256 acc, __m256i first, __m256 sw, __m256 mn, const float *dx,
                           const float *xs) {
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(first), _mm256_mul_ps(sw, _mm256_loadu_ps(dx)), acc);
    return has_min(type) ? _mm256_fmadd_ps(mn, _mm256_loadu_ps(xs), acc) : acc;
}

/* Rows m .. m + MR - 1 of x times weight row n: every float step of `tile` above, 8 lanes at once.
 * On AVX-512, an even MR and unsigned codes go two rows at a time (blocks.h's pair_sums), each
 * pair taking its float steps as soon as its sums are made: 8 rows' sums held for a float loop
 * after them were spilled to the stack (8-row products 1.00-1.06x). */
PG_INLINE void tile_avx2(const Args *a, const int type, int64_t m, const int MR, int64_t n) {
    const int64_t units = a->K / UNIT, groups = (units + GROUP - 1) / GROUP, up = a->x.units_padded;
    const uint8_t *row = a->w + n * a->row_bytes;
    __m256 acc[MR_MAX];
    for (int i = 0; i < MR; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        const int count = units - g * GROUP < GROUP ? (int)(units - g * GROUP) : GROUP;
        __m256 sw, sw2 = _mm256_setzero_ps(), mn = _mm256_setzero_ps();
        group_scales_avx2(type, row, g, count, &sw, &sw2, &mn);
#if defined(PGB_PAIRS)
        if (MR % 2 == 0 && (has_min(type) || code_offset(type))) {
            __m512i codes[GROUP];
            pair_codes(type, row, g, count, codes);
            for (int i = 0; i + 1 < MR; i += 2) {
                const __m512i f = pair_sums(type, codes, g, count, a->x.q2 + m * a->K, a->K, a->x.b + m * up, up, i);
                const int64_t at = (m + i) * up + g * GROUP;
                acc[i] = unit_step(type, acc[i], _mm512_castsi512_si256(f), sw, mn, a->x.d + at, a->x.s + at);
                acc[i + 1] = unit_step(type, acc[i + 1], _mm512_extracti64x4_epi64(f, 1), sw, mn, a->x.d + at + up,
                                       a->x.s + at + up);
            }
            continue;
        }
#endif
        __m256i first[MR_MAX], second[MR_MAX];
        group_sums_avx2(type, row, g, count, a->x.q + m * a->K, a->K, a->x.b + m * up, up, MR, first, second);
        for (int i = 0; i < MR; i++) {
            const float *dx = a->x.d + (m + i) * up + g * GROUP;
            if (type == Q6_K) {
                __m256 d0 = _mm256_permutevar8x32_ps(_mm256_loadu_ps(dx), _mm256_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3));
                __m256 d1 = _mm256_permutevar8x32_ps(_mm256_loadu_ps(dx), _mm256_setr_epi32(4, 5, 6, 7, 4, 5, 6, 7));
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(first[i]), _mm256_mul_ps(sw, d0), acc[i]);
                acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(second[i]), _mm256_mul_ps(sw2, d1), acc[i]);
                continue;
            }
            acc[i] = unit_step(type, acc[i], first[i], sw, mn, dx, a->x.s + (m + i) * up + g * GROUP);
        }
    }
    for (int i = 0; i < MR; i++) store(a, m + i, n, hsum8_avx2(acc[i]));
}

/* The weight bytes PREFETCH_BYTES (blocks.h) ahead of the row being multiplied, asked for a row at
 * a time. Only the first pass over x's rows asks: the next passes find the row in cache. */
PG_INLINE void run_rows_of(const Args *a, const int type, int64_t n_lo, int64_t n_hi) {
    const char *w = (const char *)a->w;
    Prefetch pf = {w + n_lo * a->row_bytes, w + a->N * a->row_bytes};
    int64_t m = 0;
    for (; m + MR_MAX <= a->M; m += MR_MAX)
        for (int64_t n = n_lo; n < n_hi; n++) {
            if (m == 0) prefetch_until(&pf, w + (n + 1) * a->row_bytes + PREFETCH_BYTES);
            tile_avx2(a, type, m, MR_MAX, n);
        }
    for (int64_t n = n_lo; m < a->M && n < n_hi; n++) {  // the last rows: tiles of 4, 2 and 1
        if (m == 0) prefetch_until(&pf, w + (n + 1) * a->row_bytes + PREFETCH_BYTES);
        int64_t at = m;
        if (MR_MAX > 4 && a->M - at >= 4) tile_avx2(a, type, at, 4, n), at += 4;
        if (a->M - at >= 2) tile_avx2(a, type, at, 2, n), at += 2;
        if (a->M - at >= 1) tile_avx2(a, type, at, 1, n);
    }
}

static void run_rows(const Args *a, int64_t n_lo, int64_t n_hi) {
    switch (a->type) {  // one copy of the loop per format, its branches folded away
        case Q4_0: run_rows_of(a, Q4_0, n_lo, n_hi); break;
        case Q4_1: run_rows_of(a, Q4_1, n_lo, n_hi); break;
        case Q5_0: run_rows_of(a, Q5_0, n_lo, n_hi); break;
        case Q5_1: run_rows_of(a, Q5_1, n_lo, n_hi); break;
        case Q8_0: run_rows_of(a, Q8_0, n_lo, n_hi); break;
        case Q4_K: run_rows_of(a, Q4_K, n_lo, n_hi); break;
        case Q5_K: run_rows_of(a, Q5_K, n_lo, n_hi); break;
        default: run_rows_of(a, Q6_K, n_lo, n_hi); break;
    }
}
#endif

/* Rows per task: TASK_ROWS, or as many as make TASK_BYTES (blocks.h) of weights when x has a few
 * rows (a decode step). */
static int64_t task_rows_of(int64_t M, int64_t row_bytes) {
    const int64_t rows = TASK_BYTES / row_bytes;
    return M <= MR_MAX && rows > TASK_ROWS ? rows : TASK_ROWS;
}

/* matmul_blocks_amx.c: 9 rows of x and more on AMX-INT8 tiles, with this file's numbers. `run`
 * returns how many weight rows it did (every row of x for [0, that)). */
int pg_blocks_amx_takes(const Args *a);
int64_t pg_blocks_amx_run(const Args *a, int num_threads);
/* matmul_blocks_lanes.c: every output of weights repacked 16 rows at a time. */
int pg_blocks_lanes_run(Args *a, int num_threads);
int pg_blocks_unpack(int type, const uint8_t *w, int64_t N, int64_t K, uint8_t *out);

/* Weight rows [first, N) for every row of x, in tasks of a->task_rows (first: 0, or where the AMX
 * tiles stopped). */
typedef struct {
    const Args *a;
    int64_t first;
} Outputs;

static void run_task(void *ctx, int64_t task) {
    const Outputs *o = (const Outputs *)ctx;
    const Args *a = o->a;
    const int64_t n_lo = o->first + task * a->task_rows;
    run_rows(a, n_lo, n_lo + a->task_rows < a->N ? n_lo + a->task_rows : a->N);
}

int64_t pg_block_row_bytes(int type, int64_t K) { return row_bytes_of(type, K); }

/* out[m * ldc + n] for n < N; w in the file's layout (interleave 0) or repacked 16 rows at a time
 * (16: matmul_blocks_lanes.c's pg_blocks_repack). Returns 0, or -1 when the type or K is not one
 * this file reads. */
int pg_matmul_blocks(const void *x, int x_bf16, int64_t M, int64_t K, int type, const void *w, int64_t N,
                     int interleave, const void *bias, int bias_bf16, void *out, int64_t ldc, int out_bf16,
                     int num_threads) {
    const int64_t row_bytes = row_bytes_of(type, K);
    if (row_bytes < 0) return -1;
    const int64_t units_padded = (K / UNIT + GROUP - 1) / GROUP * GROUP;
    // x quantized into buffers of the calling thread (slot 2 / 3: matmul.c uses 0 and 1)
    int8_t *q = (int8_t *)pg_scratch(2, (2 * M * K + 3) / 4), *q2 = q + M * K;
    float *ds = pg_scratch(3, 3 * M * units_padded);  // d, s, then b (int32)
    int32_t *sums = (int32_t *)(ds + 2 * M * units_padded);
    for (int64_t m = 0; m < M; m++)
        quantize_row(x, x_bf16, m, K, q + m * K, ds + m * units_padded, ds + (M + m) * units_padded,
                     sums + m * units_padded, units_padded);
    Args a = {{q, ds, ds + M * units_padded, sums, units_padded, q2}, M, K, N, type, (const uint8_t *)w, row_bytes,
              bias, bias_bf16, out, ldc, out_bf16, task_rows_of(M, row_bytes)};
    if (M * N * K < 65536) num_threads = 1;
    if (interleave) return interleave == 16 ? pg_blocks_lanes_run(&a, num_threads) : -1;
    Outputs rest = {&a, pg_blocks_amx_takes(&a) ? pg_blocks_amx_run(&a, num_threads) : 0};
    if (rest.first == N) return 0;
#if defined(PGB_PAIRS)
    for (int64_t p = 0; p + 1 < M; p += 2)  // x.q2 (the vector path's): rows p and p + 1 unit by unit, side by side
        for (int64_t u = 0; u < K / UNIT; u++) {
            memcpy(q2 + p * K + 2 * UNIT * u, q + p * K + UNIT * u, UNIT);
            memcpy(q2 + p * K + 2 * UNIT * u + UNIT, q + (p + 1) * K + UNIT * u, UNIT);
        }
#endif
    pg_parallel(num_threads, (N - rest.first + a.task_rows - 1) / a.task_rows, run_task, &rest);
    return 0;
}

/* The weights of rows [0, N) as float32 (the file's exact values), for inspections and tests; w
 * laid out as pg_matmul_blocks' (interleave). */
int pg_dequantize_blocks(int type, const void *w, int64_t N, int64_t K, int interleave, float *out) {
    const int64_t row_bytes = row_bytes_of(type, K);
    if (row_bytes < 0) return -1;
    if (interleave) {
        uint8_t *rows = (uint8_t *)malloc((size_t)(N * row_bytes));
        int status = rows && pg_blocks_unpack(type, (const uint8_t *)w, N, K, rows) == 0 ? 0 : -1;
        if (!status) status = pg_dequantize_blocks(type, rows, N, K, 0, out);
        free(rows);
        return status;
    }
    for (int64_t n = 0; n < N; n++) {
        const uint8_t *row = (const uint8_t *)w + n * row_bytes;
        for (int64_t g = 0; g < (K / UNIT + GROUP - 1) / GROUP; g++) {
            const int count = K / UNIT - g * GROUP < GROUP ? (int)(K / UNIT - g * GROUP) : GROUP;
            GroupScales s;
            group_scales(type, row, g, count, &s);
            for (int u = 0; u < count; u++) {
                int8_t q[UNIT];
                unit_codes(type, row, g * GROUP + u, q);
                for (int i = 0; i < UNIT; i++) {
                    float scale;
                    if (type == Q6_K) scale = s.sw[(u / 4) * 8 + (i / 16) * 4 + u % 4];
                    else scale = s.sw[u];
                    out[n * K + (g * GROUP + u) * UNIT + i] = scale * (float)q[i] + s.mn[u];
                }
            }
        }
    }
    return 0;
}
