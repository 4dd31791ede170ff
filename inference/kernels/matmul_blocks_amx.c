/* The block kernels' products of 9 rows of x and more on AMX-INT8 tiles (Intel Sapphire Rapids and
 * later), for matmul_blocks.c: the weights are the A tiles (16 weight rows' codes, row after row as
 * unpacked: no transpose) and x the B tile (16 rows of x, 4 codes a line: laid out once per call),
 * so one `tdpbssd` gives every (output, row) sum of a unit (Q6_K: a half-unit) exactly; each sum
 * then takes the float step its lane takes on the vector path, 16 rows of x at once, lanes in the
 * same order, so the result is bitwise that path's and the choice of path may depend on M. Rows
 * past M in the last block of 16 are zeros; outputs past the last whole 32 go to the vector path
 * (matmul_blocks.c). Must not know: models, files.
 */
#include "blocks.h"

#if defined(PGB_AVX2) && defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512BW__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>

#define AMX_ROWS 16     // rows of x per block: the B tile's 16 columns
#define AMX_OUTPUTS 32  // weight rows per task: two A tiles
#define AMX_MIN_ROWS 9  // fewer rows take the vector path (the AMX Xeon: 8 rows 43 vs 47 ms a step, 9 rows 58 vs 48)

static int blocks_amx_state;  // 0: not asked, 1: usable, -1: not here
static int blocks_amx_on = 1;

static int blocks_amx_usable(void) {
    if (blocks_amx_state == 0) blocks_amx_state = syscall(SYS_arch_prctl, 0x1023, 18) == 0 ? 1 : -1;  // XTILEDATA
    return blocks_amx_state == 1 && blocks_amx_on;
}

/* C tiles 0-1 (16 outputs x 16 rows of x, int32), A tiles 2-3 (16 outputs' codes, S bytes each),
 * B tile 4 (S / 4 x 64 bytes: 4 codes of x for each of 16 rows). */
static void amx_config(int S) {
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 2; t++) c.rows[t] = 16, c.colsb[t] = 64;
    for (int t = 2; t < 4; t++) c.rows[t] = 16, c.colsb[t] = (uint16_t)S;
    c.rows[4] = (uint8_t)(S / 4), c.colsb[4] = 64;
    _tile_loadconfig(&c);
}

/* Sub-unit j (a unit, or Q6_K's half-unit): its group, its lane in the accumulator, whether it
 * is the last of its step (Q6_K's group has two steps, units 0-3 then 4-7). */
static inline void sub_unit_lane(int type, int64_t j, int64_t *g, int *lane) {
    if (type == Q6_K) {
        const int64_t u = j / 2;
        *g = u / GROUP;
        *lane = (int)(u % 4) + 4 * (int)(j % 2);
    } else {
        *g = j / GROUP;
        *lane = (int)(j % GROUP);
    }
}

/* x as the B tiles want it, made once per call: for each block of 16 rows and sub-unit j, S / 4
 * lines of 64 bytes (line r: codes 4r..4r+3 of the sub-unit for each of the 16 rows), and each
 * sub-unit's dx and xs for the 16 rows (rows past M: codes and scales 0). */
typedef struct {
    const Args *a;
    int S;
    int64_t subs, num_blocks;
    int8_t *xv;
    float *dx, *xs;  // [block][sub-unit][16]
} AmxX;

static void amx_x(AmxX *t) {
    const Args *a = t->a;
    const int64_t up = a->x.units_padded;
    for (int64_t b = 0; b < t->num_blocks; b++)
        for (int64_t j = 0; j < t->subs; j++) {
            int8_t *lines = t->xv + (b * t->subs + j) * (t->S / 4) * 64;
            float *dx = t->dx + (b * t->subs + j) * 16, *xs = t->xs + (b * t->subs + j) * 16;
            const int64_t u = j * t->S / UNIT;
            for (int m = 0; m < AMX_ROWS; m++) {
                const int64_t row = b * AMX_ROWS + m;
                const int live = row < a->M;
                for (int r = 0; r < t->S / 4; r++) {
                    int32_t v = 0;
                    if (live) memcpy(&v, a->x.q + row * a->K + j * t->S + 4 * r, 4);
                    memcpy(lines + r * 64 + m * 4, &v, 4);
                }
                dx[m] = live ? a->x.d[row * up + u] : 0.0f;
                xs[m] = live ? a->x.s[row * up + u] : 0.0f;
            }
        }
}

/* Weight rows [n0, n0 + 32): their codes row after row (K bytes each: an A tile is 16 rows of
 * S of them), their scales by output (sw, mn: [output][sub-unit]). The rows are one stream, asked
 * for PREFETCH_BYTES ahead. */
PG_INLINE void amx_panel_of(const Args *a, const int type, int64_t n0, int S, int8_t *codes, float *sw, float *mn) {
    const int64_t units = a->K / UNIT, subs = a->K / S, groups = (units + GROUP - 1) / GROUP;
    const char *end = (const char *)a->w + a->N * a->row_bytes;
    const char *ahead = (const char *)a->w + n0 * a->row_bytes;
    for (int i = 0; i < AMX_OUTPUTS; i++) {
        const uint8_t *row = a->w + (n0 + i) * a->row_bytes;
        const char *until = (const char *)row + a->row_bytes + PREFETCH_BYTES;
        for (; ahead < until && ahead < end; ahead += 64) _mm_prefetch(ahead, _MM_HINT_T0);
        for (int64_t u = 0; u < units; u++)
            _mm256_storeu_si256((__m256i *)(codes + i * a->K + u * UNIT), unit_codes_avx2(type, row, u));
        float *s_row = sw + i * subs, *m_row = mn + i * subs;
        for (int64_t g = 0; g < groups; g++) {
            const int count = units - g * GROUP < GROUP ? (int)(units - g * GROUP) : GROUP;
            __m256 s0, s1 = _mm256_setzero_ps(), m0 = _mm256_setzero_ps();
            group_scales_avx2(type, row, g, count, &s0, &s1, &m0);  // group_scales' floats
            if (type != Q6_K) {  // sub-unit = unit: lane l is unit g * 8 + l
                float steps[8], mins[8];
                _mm256_storeu_ps(steps, s0), _mm256_storeu_ps(mins, m0);
                for (int l = 0; l < count; l++) s_row[g * GROUP + l] = steps[l], m_row[g * GROUP + l] = mins[l];
                continue;
            }
            float steps[2][8];
            _mm256_storeu_ps(steps[0], s0), _mm256_storeu_ps(steps[1], s1);
            for (int64_t j = g * GROUP * 2; j < subs && j < (g + 1) * GROUP * 2; j++) {
                int64_t gj;
                int lane;
                sub_unit_lane(type, j, &gj, &lane);
                s_row[j] = steps[(int)((j / 2) % GROUP) / 4][lane];
                m_row[j] = 0.0f;
            }
        }
    }
}

static void amx_panel(const Args *a, int64_t n0, int S, int8_t *codes, float *sw, float *mn) {
    switch (a->type) {  // one copy per format, its branches folded away
        case Q4_0: amx_panel_of(a, Q4_0, n0, S, codes, sw, mn); break;
        case Q4_1: amx_panel_of(a, Q4_1, n0, S, codes, sw, mn); break;
        case Q5_0: amx_panel_of(a, Q5_0, n0, S, codes, sw, mn); break;
        case Q5_1: amx_panel_of(a, Q5_1, n0, S, codes, sw, mn); break;
        case Q8_0: amx_panel_of(a, Q8_0, n0, S, codes, sw, mn); break;
        case Q4_K: amx_panel_of(a, Q4_K, n0, S, codes, sw, mn); break;
        case Q5_K: amx_panel_of(a, Q5_K, n0, S, codes, sw, mn); break;
        default: amx_panel_of(a, Q6_K, n0, S, codes, sw, mn); break;
    }
}

/* Sub-unit j's float step for the 32 outputs from their sums (sums: [output][16 rows]), 16 rows
 * at once: each (row, output) takes tile_avx2's step on its lane. acc: [output][lane][16 rows]. */
static inline void amx_float_step(const Args *a, const AmxX *t, int64_t b, int64_t j, const int32_t *sums,
                                  const float *sw, const float *mn, float *acc) {
    int64_t g;
    int lane;
    sub_unit_lane(a->type, j, &g, &lane);
    const __m512 dx = _mm512_loadu_ps(t->dx + (b * t->subs + j) * 16), xs = _mm512_loadu_ps(t->xs + (b * t->subs + j) * 16);
    for (int i = 0; i < AMX_OUTPUTS; i++) {
        float *at = acc + (i * 8 + lane) * 16;
        const __m512 prod = _mm512_mul_ps(_mm512_set1_ps(sw[i * t->subs + j]), dx);
        __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(sums + i * 16)), prod, _mm512_loadu_ps(at));
        if (has_min(a->type)) v = _mm512_fmadd_ps(_mm512_set1_ps(mn[i * t->subs + j]), xs, v);
        _mm512_storeu_ps(at, v);
    }
}

/* Rows of block b x outputs [n0, n0 + 32). The tiles of sub-unit j are multiplied while the float
 * step of j - 1 runs (a store right after its `tdpbssd` waited for it). */
static void amx_rows(const Args *a, const AmxX *t, int64_t b, int64_t n0, const int8_t *codes, const float *sw,
                     const float *mn, float *acc, int32_t *sums) {
    const int S = t->S;
    const int64_t units = a->K / UNIT, subs = t->subs;
    memset(acc, 0, sizeof(float) * AMX_OUTPUTS * 8 * 16);
    for (int64_t j = 0; j <= subs; j++) {
        int32_t *mine = sums + (j % 2) * AMX_OUTPUTS * 16, *previous = sums + ((j + 1) % 2) * AMX_OUTPUTS * 16;
        if (j < subs) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_loadd(2, codes + j * S, a->K);
            _tile_loadd(3, codes + 16 * a->K + j * S, a->K);
            _tile_loadd(4, t->xv + (b * subs + j) * (S / 4) * 64, 64);
            _tile_dpbssd(0, 2, 4);
            _tile_dpbssd(1, 3, 4);
        }
        if (j > 0) amx_float_step(a, t, b, j - 1, previous, sw, mn, acc);
        if (j < subs) {
            _tile_stored(0, mine, 64);  // (32 outputs, 16 rows): tile 0 is outputs 0-15, tile 1 16-31
            _tile_stored(1, mine + 16 * 16, 64);
        }
    }
    // a last group of fewer than 8 units: tile_avx2's missing lanes still add 0 * 0, which is
    // adding +0 (it turns a -0 into +0; twice, for the minimum's step, is the same)
    if (a->type != Q6_K && units % GROUP)
        for (int i = 0; i < AMX_OUTPUTS; i++)
            for (int l = (int)(units % GROUP); l < GROUP; l++) {
                float *at = acc + (i * 8 + l) * 16;
                _mm512_storeu_ps(at, _mm512_add_ps(_mm512_loadu_ps(at), _mm512_setzero_ps()));
            }
    float totals[AMX_OUTPUTS * 16];  // [output][row]
    for (int i = 0; i < AMX_OUTPUTS; i++) {  // hsum8's tree, 16 rows at once
        const float *l = acc + i * 8 * 16;
        __m512 v[8];
        for (int k = 0; k < 8; k++) v[k] = _mm512_loadu_ps(l + k * 16);
        __m512 s0 = _mm512_add_ps(v[0], v[4]), s1 = _mm512_add_ps(v[1], v[5]);
        __m512 s2 = _mm512_add_ps(v[2], v[6]), s3 = _mm512_add_ps(v[3], v[7]);
        _mm512_storeu_ps(totals + i * 16, _mm512_add_ps(_mm512_add_ps(s0, s2), _mm512_add_ps(s1, s3)));
    }
    const int live = a->M - b * AMX_ROWS < AMX_ROWS ? (int)(a->M - b * AMX_ROWS) : AMX_ROWS;
    const __m512i column = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                              _mm512_set1_epi32(16));
    for (int m = 0; m < live; m++)  // row m's 16 outputs at a time, then `store`'s bias and rounding
        for (int h = 0; h < 2; h++) {
            __m512 total = _mm512_i32gather_ps(column, totals + h * 16 * 16 + m, 4);
            const int64_t n = n0 + 16 * h;
            if (a->bias) total = _mm512_add_ps(total, load_lanes(a->bias, a->bias_bf16, n, 16));
            store_lanes(a->out, a->out_bf16, (b * AMX_ROWS + m) * a->ldc + n, total, 16);
        }
}

static void run_amx_task(void *ctx, int64_t task) {
    const AmxX *t = (const AmxX *)ctx;
    const Args *a = t->a;
    const int64_t n0 = task * AMX_OUTPUTS, subs = t->subs;
    float *scratch = pg_scratch(0, subs * AMX_OUTPUTS * 2 + AMX_OUTPUTS * 8 * 16 + 2 * AMX_OUTPUTS * 16 +
                                       AMX_OUTPUTS * a->K / 4 + 64);
    float *sw = scratch, *mn = sw + subs * AMX_OUTPUTS, *acc = mn + subs * AMX_OUTPUTS;
    int32_t *sums = (int32_t *)(acc + AMX_OUTPUTS * 8 * 16);
    int8_t *codes = (int8_t *)(((uintptr_t)(sums + 2 * AMX_OUTPUTS * 16) + 63) & ~(uintptr_t)63);
    amx_config(t->S);
    amx_panel(a, n0, t->S, codes, sw, mn);
    for (int64_t b = 0; b < t->num_blocks; b++) amx_rows(a, t, b, n0, codes, sw, mn, acc, sums);
    _tile_release();
}

/* Whether this call's outputs in whole tiles of 32 run on AMX, every row of x (the outputs past
 * them take the vector path: the same numbers). */
int pg_blocks_amx_takes(const Args *a) { return a->M >= AMX_MIN_ROWS && a->N >= AMX_OUTPUTS && blocks_amx_usable(); }

int64_t pg_blocks_amx_run(const Args *a, int num_threads) {
    AmxX t = {a, a->type == Q6_K ? 16 : UNIT, 0, (a->M + AMX_ROWS - 1) / AMX_ROWS, NULL, NULL, NULL};
    t.subs = a->K / t.S;
    // x's lines and scales: the calling thread's scratch slot 1 (slot 0 is each task's own)
    float *buffer = pg_scratch(1, t.num_blocks * t.subs * (t.S / 4 * 16 + 32) + 16);
    t.dx = buffer, t.xs = buffer + t.num_blocks * t.subs * 16;
    t.xv = (int8_t *)(((uintptr_t)(t.xs + t.num_blocks * t.subs * 16) + 63) & ~(uintptr_t)63);
    amx_x(&t);
    pg_parallel(num_threads, a->N / AMX_OUTPUTS, run_amx_task, &t);
    return a->N / AMX_OUTPUTS * AMX_OUTPUTS;
}

int pg_blocks_amx(int on) {
    if (on >= 0) blocks_amx_on = on;
    return blocks_amx_usable();
}
#else
int pg_blocks_amx_takes(const Args *a) {
    (void)a;
    return 0;
}
int64_t pg_blocks_amx_run(const Args *a, int num_threads) {
    (void)a, (void)num_threads;
    return 0;
}
int pg_blocks_amx(int on) {
    (void)on;
    return 0;
}
#endif

