/* The block kernels' products of a prompt's rows on AMX-INT8 tiles (Intel Sapphire Rapids and later),
 * for matmul_blocks.c: per 16 rows of x and 16 weight rows, one `tdpbssd` gives every (row, output)
 * sum of a unit (Q6_K: a half-unit) exactly; each sum then takes the float step its lane takes on
 * the vector path, lanes in the same order, so the result is bitwise that path's and the choice of
 * path may depend on M. Only full blocks of 16 rows x 32 outputs run here; matmul_blocks.c does the
 * rest. Must not know: models, files.
 */
#include "blocks.h"

#if defined(PGB_AVX2) && defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512BW__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>

#define AMX_ROWS 16
#define AMX_OUTPUTS 32  // weight rows per task: two B tiles

static int blocks_amx_state;  // 0: not asked, 1: usable, -1: not here
static int blocks_amx_on = 1;

static int blocks_amx_usable(void) {
    if (blocks_amx_state == 0) blocks_amx_state = syscall(SYS_arch_prctl, 0x1023, 18) == 0 ? 1 : -1;  // XTILEDATA
    return blocks_amx_state == 1 && blocks_amx_on;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

/* C tiles 0-1 (16 x 16 int32), A tile 2 (16 rows of x, S bytes), B tiles 3-4 (S / 4 x 64 bytes). */
static void amx_config(int S) {
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 2; t++) c.rows[t] = 16, c.colsb[t] = 64;
    c.rows[2] = 16, c.colsb[2] = (uint16_t)S;
    for (int t = 3; t < 5; t++) c.rows[t] = (uint8_t)(S / 4), c.colsb[t] = 64;
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

/* out[k] = dword k of each of in[0..7] (an 8 x 8 transpose of dwords). */
static inline void transpose_8x8(const __m256i in[8], __m256i out[8]) {
    __m256i t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(in[i], in[i + 1]);
        t[i + 1] = _mm256_unpackhi_epi32(in[i], in[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int k = 0; k < 4; k++) {
        out[k] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x20);
        out[k + 4] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x31);
    }
}

/* Weight rows [n0, n0 + 32): each sub-unit's codes as two B tiles (dword (r, i) = codes 4r..4r+3 of
 * row n0 + 16 t + i), 8 rows' codes transposed at a time, and its scales (sw, mn) per output. */
static void amx_panel(const Args *a, int64_t n0, int S, int8_t *tiles, float *sw, float *mn) {
    const int64_t units = a->K / UNIT, subs = a->K / S, groups = (units + GROUP - 1) / GROUP;
    for (int i0 = 0; i0 < AMX_OUTPUTS; i0 += 8) {  // outputs i0 .. i0 + 7: tile i0 / 16, its half (i0 % 16) / 8
        const uint8_t *rows[8];
        for (int i = 0; i < 8; i++) rows[i] = a->w + (n0 + i0 + i) * a->row_bytes;
        for (int64_t u = 0; u < units; u++) {
            if (i0 + 8 < AMX_OUTPUTS)  // the next 8 rows' bytes of this unit: they come from memory
                for (int i = 0; i < 8; i++) _mm_prefetch((const char *)rows[i] + 8 * a->row_bytes + u * block_bytes(a->type), _MM_HINT_T0);
            __m256i codes[8], dwords[8];
            for (int i = 0; i < 8; i++) codes[i] = unit_codes_avx2(a->type, rows[i], u);
            transpose_8x8(codes, dwords);  // dwords[k]: codes 4k..4k+3 of the 8 rows
            for (int k = 0; k < 8; k++) {
                const int64_t j = u * (UNIT / S) + k / (S / 4);
                const int r = k % (S / 4);
                int8_t *b = tiles + (j * 2 + i0 / 16) * (S * 16) + r * 64 + (i0 % 16) * 4;
                _mm256_storeu_si256((__m256i *)b, dwords[k]);
            }
        }
    }
    for (int i = 0; i < AMX_OUTPUTS; i++) {
        const uint8_t *row = a->w + (n0 + i) * a->row_bytes;
        for (int64_t g = 0; g < groups; g++) {
            const int count = units - g * GROUP < GROUP ? (int)(units - g * GROUP) : GROUP;
            float steps[2][8], mins[8];  // group_scales_avx2: group_scales' floats, 8 lanes at once
            __m256 s0, s1 = _mm256_setzero_ps(), m0 = _mm256_setzero_ps();
            group_scales_avx2(a->type, row, g, count, &s0, &s1, &m0);
            _mm256_storeu_ps(steps[0], s0), _mm256_storeu_ps(steps[1], s1), _mm256_storeu_ps(mins, m0);
            for (int64_t j = g * GROUP * (UNIT / S); j < subs && j < (g + 1) * GROUP * (UNIT / S); j++) {
                int64_t gj;
                int lane;
                sub_unit_lane(a->type, j, &gj, &lane);
                const int step = a->type == Q6_K ? (int)((j / 2) % GROUP) / 4 : 0;
                sw[j * AMX_OUTPUTS + i] = steps[step][lane];
                mn[j * AMX_OUTPUTS + i] = a->type == Q6_K ? 0.0f : mins[lane];
            }
        }
    }
}

/* Sub-unit j's float step for rows [m0, m0 + 16) from its sums (16 rows x 32 outputs). */
static inline void amx_float_step(const Args *a, int64_t m0, int S, int64_t j, const int32_t *sums, const float *sw,
                                  const float *mn, float *acc) {
    const int64_t u = j * S / UNIT, up = a->x.units_padded;
    int64_t g;
    int lane;
    sub_unit_lane(a->type, j, &g, &lane);
    for (int m = 0; m < AMX_ROWS; m++) {
        const float dx = a->x.d[(m0 + m) * up + u], xs = a->x.s[(m0 + m) * up + u];
        for (int h = 0; h < 2; h++) {
            float *at = acc + (m * 8 + lane) * AMX_OUTPUTS + 16 * h;
            __m512 prod = _mm512_mul_ps(_mm512_loadu_ps(sw + j * AMX_OUTPUTS + 16 * h), _mm512_set1_ps(dx));
            __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(sums + m * 32 + 16 * h)), prod,
                                       _mm512_loadu_ps(at));
            if (has_min(a->type))
                v = _mm512_fmadd_ps(_mm512_loadu_ps(mn + j * AMX_OUTPUTS + 16 * h), _mm512_set1_ps(xs), v);
            _mm512_storeu_ps(at, v);
        }
    }
}

/* Rows [m0, m0 + 16) x outputs [n0, n0 + 32). acc: (16 rows, 8 lanes, 32 outputs). The tiles of
 * sub-unit j are multiplied while the float step of j - 1 runs (a store right after its
 * `tdpbssd` waited for it: a third of the time). */
static void amx_rows(const Args *a, int64_t m0, int64_t n0, int S, const int8_t *tiles, const float *sw,
                     const float *mn, float *acc, int32_t *sums) {
    const int64_t units = a->K / UNIT, subs = a->K / S;
    memset(acc, 0, sizeof(float) * AMX_ROWS * 8 * AMX_OUTPUTS);
    for (int64_t j = 0; j <= subs; j++) {
        int32_t *mine = sums + (j % 2) * AMX_ROWS * 32, *previous = sums + ((j + 1) % 2) * AMX_ROWS * 32;
        if (j < subs) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_loadd(2, a->x.q + m0 * a->K + j * S, a->K);
            _tile_loadd(3, tiles + (j * 2) * (S * 16), 64);
            _tile_loadd(4, tiles + (j * 2 + 1) * (S * 16), 64);
            _tile_dpbssd(0, 2, 3);
            _tile_dpbssd(1, 2, 4);
        }
        if (j > 0) amx_float_step(a, m0, S, j - 1, previous, sw, mn, acc);
        if (j < subs) {
            _tile_stored(0, mine, 128);  // (16 rows, 32 outputs): tile 0 in columns 0-15, tile 1 in 16-31
            _tile_stored(1, mine + 16, 128);
        }
    }
    // a last group of fewer than 8 units: tile_avx2's missing lanes still add 0 * 0, which is
    // adding +0 (it turns a -0 into +0; twice, for the minimum's step, is the same)
    if (a->type != Q6_K && units % GROUP)
        for (int m = 0; m < AMX_ROWS; m++)
            for (int l = (int)(units % GROUP); l < GROUP; l++)
                for (int h = 0; h < 2; h++) {
                    float *at = acc + (m * 8 + l) * AMX_OUTPUTS + 16 * h;
                    _mm512_storeu_ps(at, _mm512_add_ps(_mm512_loadu_ps(at), _mm512_setzero_ps()));
                }
    for (int m = 0; m < AMX_ROWS; m++)  // hsum8's tree, 16 outputs at once, then `store`'s bias and rounding
        for (int h = 0; h < 2; h++) {
            const float *l = acc + m * 8 * AMX_OUTPUTS + 16 * h;
            __m512 v[8];
            for (int i = 0; i < 8; i++) v[i] = _mm512_loadu_ps(l + i * AMX_OUTPUTS);
            __m512 s0 = _mm512_add_ps(v[0], v[4]), s1 = _mm512_add_ps(v[1], v[5]);
            __m512 s2 = _mm512_add_ps(v[2], v[6]), s3 = _mm512_add_ps(v[3], v[7]);
            __m512 total = _mm512_add_ps(_mm512_add_ps(s0, s2), _mm512_add_ps(s1, s3));
            const int64_t n = n0 + 16 * h;
            if (a->bias) total = _mm512_add_ps(total, load_lanes(a->bias, a->bias_bf16, n, 16));
            store_lanes(a->out, a->out_bf16, (m0 + m) * a->ldc + n, total, 16);
        }
}

static void run_amx_task(void *ctx, int64_t task) {
    const Args *a = (const Args *)ctx;
    const int S = a->type == Q6_K ? 16 : UNIT;
    const int64_t n0 = task * AMX_OUTPUTS, subs = a->K / S;
    float *scratch = pg_scratch(0, subs * AMX_OUTPUTS * 2 + AMX_ROWS * 8 * AMX_OUTPUTS + 2 * AMX_ROWS * 32 +
                                       subs * 2 * S * 16 / 4 + 64);
    float *sw = scratch, *mn = sw + subs * AMX_OUTPUTS, *acc = mn + subs * AMX_OUTPUTS;
    int32_t *sums = (int32_t *)(acc + AMX_ROWS * 8 * AMX_OUTPUTS);
    int8_t *tiles = (int8_t *)(((uintptr_t)(sums + 2 * AMX_ROWS * 32) + 63) & ~(uintptr_t)63);
    amx_config(S);
    amx_panel(a, n0, S, tiles, sw, mn);
    for (int64_t m0 = 0; m0 + AMX_ROWS <= a->M; m0 += AMX_ROWS) amx_rows(a, m0, n0, S, tiles, sw, mn, acc, sums);
    _tile_release();
}

/* Whether this call's full 16-row blocks x 32-output tiles run on AMX (rows and outputs past them
 * take the vector path: the same numbers). */
int pg_blocks_amx_takes(const Args *a) { return a->M >= AMX_ROWS && a->N >= AMX_OUTPUTS && blocks_amx_usable(); }

void pg_blocks_amx_run(const Args *a, int num_threads) {
    pg_parallel(num_threads, a->N / AMX_OUTPUTS, run_amx_task, (void *)a);
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
void pg_blocks_amx_run(const Args *a, int num_threads) { (void)a, (void)num_threads; }
int pg_blocks_amx(int on) {
    (void)on;
    return 0;
}
#endif

