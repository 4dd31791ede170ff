/* The block kernels' products on weights repacked at load 16 rows at a time, outputs as vector
 * lanes (Q4_0, Q5_0, Q8_0, Q4_K, Q6_K on AVX512-VNNI), for matmul_blocks.c.
 *
 * Why: a batch of decode steps (8 streams) multiplies each weight unit by 8 rows of x. Row by row
 * (matmul_blocks.c's tile_avx2), each unit's 8-lane dot product must be added up across its lanes
 * before its scale applies: more instructions than the products themselves. Here a vector holds
 * 16 weight rows' codes, 4 of each, as llama.cpp's repacked "x8" layouts do, and one `vpdpbusd`
 * with 4 codes of x broadcast gives a step of 16 outputs' sums: a unit is 8 of them, exact, with
 * nothing to add across lanes; its float step is one vector for the 16 outputs.
 *
 * The repacked layout: the rows in blocks of 16 (N a multiple of 16), a block GGML block after
 * GGML block (a unit of 32; a K-quant's super-block of 256), each a record of the 16 rows' bytes:
 * their fp16 fields 16 at a time (d; Q4_K: d, dmin), then the rest of their bytes 4 at a time, word
 * w of row j at (16 w + j) * 4 after them (Q5_0: qh, then qs; Q4_K: its 12 bytes of scales, then
 * qs; Q6_K: ql, qh, scales). A block is the 16 rows' bytes, so a band of rows at a multiple of 16
 * is still a band. A prompt's rows (32 and more) go on AMX-INT8 tiles where the CPU has them: the
 * records' codes are B tiles as they are.
 *
 * The float order is tile_avx2's, lane for lane: acc[l] = fma(sum, sw * dx, acc[l]) for the unit
 * in lane l = u % 8 of its group, the same exact integer sums, units missing from a row's last
 * group adding +0, then hsum8's tree and the bias: bitwise the file layout's numbers, at any M.
 * Must not know: models, files.
 */
#include "blocks.h"

#define LANES 16       // weight rows per block: the lanes of a 512-bit vector of int32
#define LANES_ROWS 32  // rows of x whose accumulators a task holds at once (32 x 8 x 64 bytes: L1)

/* Where a block's bytes go in a record: its fp16 fields (halves, at half_at) first, 16 rows of
 * each; then its other bytes from word_at on, 4 at a time, 16 rows of each word. */
typedef struct {
    int halves, half_at[2], words, word_at;
} Record;

/* The record of a format this layout takes (words 0: one it does not). */
static Record record_of(int type) {
    switch (type) {
        case Q4_0: return (Record){1, {0, 0}, 4, 2};
        case Q5_0: return (Record){1, {0, 0}, 5, 2};  // qh, then qs
        case Q8_0: return (Record){1, {0, 0}, 8, 2};
        case Q4_K: return (Record){2, {0, 2}, 35, 4};  // d, dmin; 3 words of scales, 32 of qs
        case Q6_K: return (Record){1, {208, 0}, 52, 0};  // d; 32 words of ql, 16 of qh, 4 of scales
        default: return (Record){0, {0, 0}, 0, 0};
    }
}

/* The 16 rows of a block (file layout, row_bytes apart: `rows`) and its record, one way or the
 * other (to_record). */
static void move_block(int type, uint8_t *rows, int64_t row_bytes, int64_t blocks, uint8_t *records, int to_record) {
    const int bytes = block_bytes(type);
    const Record r = record_of(type);
    for (int64_t k = 0; k < blocks; k++) {
        uint8_t *record = records + k * LANES * bytes;
        for (int j = 0; j < LANES; j++) {
            uint8_t *b = rows + j * row_bytes + k * bytes;
            for (int h = 0; h < r.halves; h++) {
                uint8_t *in_record = record + (LANES * h + j) * 2;
                to_record ? memcpy(in_record, b + r.half_at[h], 2) : memcpy(b + r.half_at[h], in_record, 2);
            }
            for (int w = 0; w < r.words; w++) {
                uint8_t *in_record = record + LANES * 2 * r.halves + (LANES * w + j) * 4;
                to_record ? memcpy(in_record, b + r.word_at + 4 * w, 4) : memcpy(b + r.word_at + 4 * w, in_record, 4);
            }
        }
    }
}

/* Rows per block this build multiplies `type` in when repacked (16), or 0: served as the file
 * stores it. */
int pg_blocks_interleave(int type) {
#if defined(PGB_PAIRS)
    return record_of(type).words ? LANES : 0;
#else
    (void)type;
    return 0;
#endif
}

/* w (N, row bytes) repacked in place. 0, or -1 (not a format or shape the layout takes). */
int pg_blocks_repack(int type, uint8_t *w, int64_t N, int64_t K) {
    const int64_t row_bytes = row_bytes_of(type, K);
    if (row_bytes < 0 || !record_of(type).words || N % LANES) return -1;
    uint8_t *rows = (uint8_t *)malloc((size_t)(LANES * row_bytes));
    if (!rows) return -1;
    for (int64_t b = 0; b < N / LANES; b++) {
        memcpy(rows, w + b * LANES * row_bytes, (size_t)(LANES * row_bytes));
        move_block(type, rows, row_bytes, K / block_weights(type), w + b * LANES * row_bytes, 1);
    }
    free(rows);
    return 0;
}

/* Repacked w (N, row bytes) back in the file's layout, into out. 0, or -1. */
int pg_blocks_unpack(int type, const uint8_t *w, int64_t N, int64_t K, uint8_t *out) {
    const int64_t row_bytes = row_bytes_of(type, K);
    if (row_bytes < 0 || !record_of(type).words || N % LANES) return -1;
    for (int64_t b = 0; b < N / LANES; b++)
        move_block(type, out + b * LANES * row_bytes, row_bytes, K / block_weights(type),
                   (uint8_t *)(w + b * LANES * row_bytes), 0);
    return 0;
}

#if defined(PGB_PAIRS)
/* x unit by unit, its rows side by side (a unit's codes of 8 rows: 4 cache lines in a row; the
 * rows of a 4864-wide x, row after row, were 8 streams that the weights' stream pushed out of L1):
 * codes [unit][row][32], dx and xs [unit][row], and the sums' starts [unit][row][2]: minus the
 * code offset's share (Q6_K: of each half-unit), taken off before the products are added. */
typedef struct {
    const Args *a;
    const int8_t *q;
    const float *dx, *xs;
    const int32_t *start;
} Lanes;

PG_INLINE __m512i nibbles(__m512i v, int high) {
    return _mm512_and_si512(high ? _mm512_srli_epi16(v, 4) : v, _mm512_set1_epi8(0xF));
}

/* Byte `byte` of each lane's int32 word (signed or not), as floats. */
PG_INLINE __m512 byte_lanes(__m512i word, int byte, int is_signed) {
    const __m512i up = _mm512_slli_epi32(word, 24 - 8 * byte);
    return _mm512_cvtepi32_ps(is_signed ? _mm512_srai_epi32(up, 24) : _mm512_srli_epi32(up, 24));
}

/* What lanes_unit adds to a format's codes to make them unsigned (Q4_K's are). */
PG_INLINE int lanes_offset(const int type) {
    return type == Q8_0 ? 128 : type == Q6_K ? 32 : type == Q5_0 ? 16 : type == Q4_0 ? 8 : 0;
}

/* Unit `sub` of a record (0 for the formats of 32; 0-7 of a K-quant's super-block): its codes
 * for the 16 rows, unsigned (q + code offset, or a format with a minimum), vector t holding codes
 * 4t .. 4t + 3 of each row, row j in lane j; its scales sw (Q6_K: sw, sw2 for its two halves) and
 * minimums mn (Q4_K): group_scales' floats. */
PG_INLINE void lanes_unit(const int type, const uint8_t *record, int sub, __m512i q[8], __m512 *sw, __m512 *sw2,
                          __m512 *mn) {
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)record));
    const uint8_t *words = record + 32 * record_of(type).halves;
#define WORD(w) _mm512_loadu_si512(words + 64 * (w))
    if (type == Q8_0) {
        for (int t = 0; t < 8; t++) q[t] = _mm512_xor_si512(WORD(t), _mm512_set1_epi8(-128));
    } else if (type == Q4_0 || type == Q5_0) {
        const int at = type == Q5_0;  // qh first
        for (int t = 0; t < 4; t++) {  // word t of qs: codes 4t .. 4t + 3 low, 16 + 4t .. high
            q[t] = nibbles(WORD(at + t), 0);
            q[t + 4] = nibbles(WORD(at + t), 1);
        }
        if (type == Q5_0)
            for (int t = 0; t < 8; t++) {  // bits 4t .. 4t + 3 of qh: its byte t / 2 in all 4 bytes of
                                           // its lane, byte i testing bit 4 (t % 2) + i
                const __m512i pick = _mm512_add_epi8(_mm512_set4_epi32(0x0C0C0C0C, 0x08080808, 0x04040404, 0),
                                                     _mm512_set1_epi8((char)(t / 2)));
                const __mmask64 high = _mm512_test_epi8_mask(_mm512_shuffle_epi8(WORD(0), pick),
                                                             _mm512_set1_epi32(0x08040201 << (4 * (t % 2))));
                q[t] = _mm512_mask_add_epi8(q[t], high, q[t], _mm512_set1_epi8(16));
            }
    } else if (type == Q4_K) {  // words 0-2: scales; 3 + 8p + c: qs of units 2p (low) and 2p + 1 (high)
        for (int c = 0; c < 8; c++) q[c] = nibbles(WORD(3 + 8 * (sub / 2) + c), sub % 2);
        const __m512i k0 = WORD(0), k1 = WORD(1), k2 = WORD(2), six = _mm512_set1_epi8(0x3f);
        __m512i sc, m;  // scale_min_k4 on 16 rows at once (llama.cpp's masks, as group_scales_avx2)
        if (sub < 4) {
            sc = _mm512_and_si512(k0, six);
            m = _mm512_and_si512(k1, six);
        } else {
            const __m512i low = _mm512_set1_epi8(0x0f), two = _mm512_set1_epi8(0x03);
            sc = _mm512_or_si512(_mm512_and_si512(k2, low),
                                 _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(k0, 6), two), 4));
            m = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(k2, 4), low),
                                _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(k1, 6), two), 4));
        }
        const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(record + 32)));
        *sw = _mm512_mul_ps(d, byte_lanes(sc, sub % 4, 0));
        *mn = _mm512_xor_ps(_mm512_mul_ps(dmin, byte_lanes(m, sub % 4, 0)), _mm512_set1_ps(-0.0f));
        return;
    } else {  // Q6_K: words 0-31 ql, 32-47 qh, 48-51 scales
        const int h = sub / 4, t = sub % 4;
        for (int c = 0; c < 8; c++) {
            const __m512i high = _mm512_and_si512(_mm512_srli_epi16(WORD(32 + 8 * h + c), 2 * t), _mm512_set1_epi8(3));
            q[c] = _mm512_or_si512(nibbles(WORD(16 * h + 8 * (t & 1) + c), t >= 2), _mm512_slli_epi16(high, 4));
        }
        const __m512i sc = WORD(48 + 2 * h + t / 2);  // scales 8h + 2t and 8h + 2t + 1: its bytes 2 (t % 2) and + 1
        *sw = _mm512_mul_ps(d, byte_lanes(sc, 2 * (t % 2), 1));
        *sw2 = _mm512_mul_ps(d, byte_lanes(sc, 2 * (t % 2) + 1, 1));
        return;
    }
#undef WORD
    *sw = d;
}

/* The 16 rows' exact sums of a unit with one row of x (its 32 codes at xu): codes 0-15 plus
 * start0, codes 16-31 plus start1 (two chains of 4 `vpdpbusd`: one of 8 waited on itself). */
PG_INLINE void lanes_sums(const __m512i q[8], const int8_t *xu, int32_t start0, int32_t start1, __m512i *s0,
                          __m512i *s1) {
    __m512i a = _mm512_set1_epi32(start0), b = _mm512_set1_epi32(start1);
    for (int t = 0; t < 4; t++) {  // x's 4 codes as the instruction's broadcast operand: one micro-op each
        __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(a) : "v"(q[t]), "m"(*(const int32_t *)(xu + 4 * t)));
        __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(b) : "v"(q[t + 4]), "m"(*(const int32_t *)(xu + 16 + 4 * t)));
    }
    *s0 = a, *s1 = b;
}

/* x's scales unit by unit, rows side by side (dx and xs [unit][rows]: a unit's scales of every row
 * in a row), rows from M up to `rows` zero: both paths' layout. */
static void lanes_x_scales(const Args *a, int64_t rows, float *dx, float *xs) {
    const int64_t units = a->K / UNIT;
    memset(dx, 0, sizeof(float) * (size_t)(units * rows));
    memset(xs, 0, sizeof(float) * (size_t)(units * rows));
    for (int64_t m = 0; m < a->M; m++)
        for (int64_t u = 0; u < units; u++) {
            dx[u * rows + m] = a->x.d[m * a->x.units_padded + u];
            xs[u * rows + m] = a->x.s[m * a->x.units_padded + u];
        }
}

PG_INLINE void acc_fma(float *at, __m512i sums, __m512 sw, __m512 dx) {
    _mm512_storeu_ps(at, _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_mul_ps(sw, dx), _mm512_loadu_ps(at)));
}

/* Unit u's float step for one row of x (dx1, xs: its scales for the unit; row: its accumulators [8
 * lanes][16 outputs]) from the unit's sums s0 (Q6_K: its halves' sums s0, s1): tile_avx2's steps,
 * a lane each. */
PG_INLINE void lanes_step(const int type, int64_t u, float dx1, float xs, float *row, __m512i s0, __m512i s1,
                          __m512 sw, __m512 sw2, __m512 mn) {
    const __m512 dx = _mm512_set1_ps(dx1);
    if (type == Q6_K) {  // its half-units in lanes u % 4 and u % 4 + 4 (the vector path's order)
        acc_fma(row + (u % 4) * LANES, s0, sw, dx);
        acc_fma(row + (u % 4 + 4) * LANES, s1, sw2, dx);
        return;
    }
    float *lane = row + (u % GROUP) * LANES;
    acc_fma(lane, s0, sw, dx);
    if (type == Q4_K) _mm512_storeu_ps(lane, _mm512_fmadd_ps(mn, _mm512_set1_ps(xs), _mm512_loadu_ps(lane)));
}

/* Rows m0 .. m0 + rows - 1 of block b's outputs from their accumulators (acc [rows][8 lanes][16
 * outputs]): hsum8's tree, the bias, one rounding. */
static void lanes_store(const Args *a, int64_t b, int64_t m0, int64_t rows, const float *acc) {
    const int64_t units = a->K / UNIT;
    for (int64_t i = 0; i < rows; i++) {
        const float *r = acc + i * 8 * LANES;
        __m512 v[8];
        for (int l = 0; l < 8; l++) {
            v[l] = _mm512_loadu_ps(r + l * LANES);
            // a lane the row's last group misses took fma(0, 0, acc) on the file layout's path: + 0
            if (units % GROUP && l >= units % GROUP) v[l] = _mm512_add_ps(v[l], _mm512_setzero_ps());
        }
        __m512 s0 = _mm512_add_ps(v[0], v[4]), s1 = _mm512_add_ps(v[1], v[5]);
        __m512 s2 = _mm512_add_ps(v[2], v[6]), s3 = _mm512_add_ps(v[3], v[7]);
        __m512 total = _mm512_add_ps(_mm512_add_ps(s0, s2), _mm512_add_ps(s1, s3));
        const int64_t n = b * LANES;
        if (a->bias) total = _mm512_add_ps(total, load_lanes(a->bias, a->bias_bf16, n, LANES));
        store_lanes(a->out, a->out_bf16, (m0 + i) * a->ldc + n, total, LANES);
    }
}

/* Outputs of block b (16) for rows m0 .. m0 + rows - 1 of x: acc [rows][8 lanes][16 outputs]. */
PG_INLINE void lanes_block(const Lanes *c, const int type, int64_t b, int64_t m0, int64_t rows, float *acc,
                           Prefetch *pf) {
    const Args *a = c->a;
    const int64_t units = a->K / UNIT, per_record = block_weights(type) / UNIT;
    const int bytes = block_bytes(type);
    const uint8_t *block = a->w + b * LANES * a->row_bytes;
    memset(acc, 0, sizeof(float) * (size_t)(rows * 8 * LANES));
    for (int64_t u = 0; u < units; u++) {
        const int sub = (int)(u % per_record);
        const uint8_t *record = block + (u / per_record) * LANES * bytes;
        if (pf && !sub) prefetch_until(pf, (const char *)record + LANES * bytes + PREFETCH_BYTES);
        __m512i q[8];
        __m512 sw, sw2 = _mm512_setzero_ps(), mn = _mm512_setzero_ps();
        lanes_unit(type, record, sub, q, &sw, &sw2, &mn);
        for (int64_t i = 0; i < rows; i++) {
            const int64_t at = u * a->M + m0 + i;
            __m512i s0, s1;
            lanes_sums(q, c->q + at * UNIT, c->start[2 * at], c->start[2 * at + 1], &s0, &s1);
            if (type != Q6_K) s0 = _mm512_add_epi32(s0, s1);
            lanes_step(type, u, c->dx[at], c->xs[at], acc + i * 8 * LANES, s0, s1, sw, sw2, mn);
        }
    }
    lanes_store(a, b, m0, rows, acc);
}

PG_INLINE void lanes_blocks_of(const Lanes *c, const int type, int64_t b_lo, int64_t b_hi) {
    const Args *a = c->a;
    float *acc = pg_scratch(0, LANES_ROWS * 8 * LANES);
    const char *w = (const char *)a->w;
    Prefetch pf = {w + b_lo * LANES * a->row_bytes, w + a->N * a->row_bytes};  // a record at a time, the first pass
    for (int64_t b = b_lo; b < b_hi; b++)
        for (int64_t m0 = 0; m0 < a->M; m0 += LANES_ROWS)
            lanes_block(c, type, b, m0, a->M - m0 < LANES_ROWS ? a->M - m0 : LANES_ROWS, acc, m0 ? NULL : &pf);
}

static void lanes_task(void *ctx, int64_t task) {
    const Lanes *c = (const Lanes *)ctx;
    const int64_t blocks = c->a->N / LANES, b_lo = task * c->a->task_rows;
    const int64_t b_hi = b_lo + c->a->task_rows < blocks ? b_lo + c->a->task_rows : blocks;
    switch (c->a->type) {  // one copy per format, its branches folded away
        case Q4_0: lanes_blocks_of(c, Q4_0, b_lo, b_hi); break;
        case Q5_0: lanes_blocks_of(c, Q5_0, b_lo, b_hi); break;
        case Q8_0: lanes_blocks_of(c, Q8_0, b_lo, b_hi); break;
        case Q4_K: lanes_blocks_of(c, Q4_K, b_lo, b_hi); break;
        default: lanes_blocks_of(c, Q6_K, b_lo, b_hi); break;
    }
}

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__)
/* Rows of x from which the products run on AMX-INT8 tiles: the repacked codes are B tiles as they
 * are (line t: codes 4t .. 4t + 3 of 16 outputs), x the A tiles (16 rows of a unit's codes), one
 * `tdpbssd` a unit's exact sums for 16 rows and 16 outputs; each sum then takes lanes_step's float
 * step (kept in registers for the formats whose unit feeds one lane). */
// (the AMX Xeon, Q5_0 9728 x 896: 16 rows 2.6 vs 2.4 ms on vectors, 32 rows 4.2 vs 4.5, 128: 13 vs 17)
#define LANES_AMX_MIN_ROWS 32
int pg_blocks_amx(int on);  // matmul_blocks_amx.c: whether AMX tiles are usable here (and on)

/* C tiles 0-1 and 6-7 (16 rows of x x 16 outputs, int32: a unit's sums, or Q6_K's two halves'),
 * A tiles 2-3 (16 rows of x, S codes each), B tiles 4-5 (S / 4 lines of 64 bytes); S: 32, Q6_K 16. */
static void lanes_amx_config(int S) {
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 2; t++) {
        c.rows[t] = c.rows[6 + t] = 16, c.colsb[t] = c.colsb[6 + t] = 64;
        c.rows[2 + t] = 16, c.colsb[2 + t] = (uint16_t)S;
        c.rows[4 + t] = (uint8_t)(S / 4), c.colsb[4 + t] = 64;
    }
    _tile_loadconfig(&c);
}

typedef struct {
    const Args *a;
    const int8_t *xq;       // x's codes as A tiles: [16 rows][unit][16 rows][32], rows zero up to a whole tile
    const float *dx, *xs;  // x's scales (lanes_x_scales), rows padded as xq's
    int64_t rows;           // x's rows padded to whole tiles
} LanesAmx;

/* Block b's codes as B tiles, signed ([unit][8 lines][64 bytes]), and its scales ([unit][16]). */
PG_INLINE void lanes_amx_stage(const Args *a, const int type, int64_t b, int8_t *codes, float *sw, Prefetch *pf) {
    const int64_t units = a->K / UNIT, per_record = block_weights(type) / UNIT;
    const int bytes = block_bytes(type);
    const uint8_t *block = a->w + b * LANES * a->row_bytes;
    for (int64_t u = 0; u < units; u++) {
        const uint8_t *record = block + (u / per_record) * LANES * bytes;
        if (!(u % per_record)) prefetch_until(pf, (const char *)record + LANES * bytes + PREFETCH_BYTES);
        __m512i q[8];
        __m512 s = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(), m = _mm512_setzero_ps();
        lanes_unit(type, record, (int)(u % per_record), q, &s, &s2, &m);
        for (int t = 0; t < 8; t++)
            _mm512_storeu_si512(codes + u * 512 + 64 * t, _mm512_sub_epi8(q[t], _mm512_set1_epi8((char)lanes_offset(type))));
        _mm512_storeu_ps(sw + 3 * u * LANES, s);
        _mm512_storeu_ps(sw + (3 * u + 1) * LANES, s2);
        _mm512_storeu_ps(sw + (3 * u + 2) * LANES, m);
    }
}

/* Unit u's sums for 16 rows of x into C tiles 0 (and 1: Q6_K's second half), or 6 (and 7) when
 * `odd`: two sets, so one unit's tiles multiply while the one before is stored. */
PG_INLINE void lanes_amx_tiles(const LanesAmx *t, const int type, int64_t m0, int64_t u, const int8_t *codes,
                               int odd) {
    const int8_t *x = t->xq + (m0 * (t->a->K / UNIT) + 16 * u) * UNIT;
    _tile_loadd(2, x, UNIT);
    _tile_loadd(4, codes + u * 512, 64);
    if (type == Q6_K) {
        _tile_loadd(3, x + 16, UNIT);
        _tile_loadd(5, codes + u * 512 + 256, 64);
    }
    if (odd) {
        _tile_zero(6);
        _tile_dpbssd(6, 2, 4);
        if (type == Q6_K) {
            _tile_zero(7);
            _tile_dpbssd(7, 3, 5);
        }
    } else {
        _tile_zero(0);
        _tile_dpbssd(0, 2, 4);
        if (type == Q6_K) {
            _tile_zero(1);
            _tile_dpbssd(1, 3, 5);
        }
    }
}

PG_INLINE void lanes_amx_sums(const int type, int32_t *sums, int odd) {
    if (odd) {
        _tile_stored(6, sums, 64);
        if (type == Q6_K) _tile_stored(7, sums + 256, 64);
    } else {
        _tile_stored(0, sums, 64);
        if (type == Q6_K) _tile_stored(1, sums + 256, 64);
    }
}

/* Rows m0 .. m0 + 15 of x times block b's staged codes, the units in `order`: lane by lane (u = l,
 * l + 8, ...: each lane's own order), so a lane's 16 rows' accumulators stay in registers until
 * its last unit (Q6_K, whose units feed two lanes each: in order, its accumulators in acc). Two
 * units ahead of the float step: unit k + 2's tiles multiply and unit k + 1's sums are stored
 * while unit k's float step runs (sums: three buffers of [2 halves][16 rows][16 outputs]): a store
 * right after its `tdpbssd`, or a read right after its store, waited. */
PG_INLINE void lanes_amx_rows(const LanesAmx *t, const int type, int64_t b, int64_t m0, const int8_t *codes,
                              const float *sw, const int32_t *order, float *acc, int32_t *sums) {
    const Args *a = t->a;
    const int64_t units = a->K / UNIT, live = a->M - m0 < 16 ? a->M - m0 : 16;
    const float *dx = t->dx + m0, *xs = t->xs + m0;  // [unit][t->rows]: rows past M 0
    if (type == Q6_K || units < GROUP) memset(acc, 0, sizeof(float) * 16 * 8 * LANES);  // else each lane is stored
    __m512 r[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_setzero_ps();
    lanes_amx_tiles(t, type, m0, order[0], codes, 0);
    lanes_amx_sums(type, sums, 0);
    if (units > 1) lanes_amx_tiles(t, type, m0, order[1], codes, 1);
    for (int64_t k = 0; k < units; k++) {
        const int64_t u = order[k];
        if (k + 1 < units) lanes_amx_sums(type, sums + ((k + 1) % 3) * 512, (k + 1) % 2);
        if (k + 2 < units) lanes_amx_tiles(t, type, m0, order[k + 2], codes, k % 2);
        const int32_t *now = sums + (k % 3) * 512;
        const float *s = sw + 3 * u * LANES;
        const __m512 s0 = _mm512_loadu_ps(s), s1 = _mm512_loadu_ps(s + LANES), mn = _mm512_loadu_ps(s + 2 * LANES);
        const float *dxu = dx + u * t->rows, *xsu = xs + u * t->rows;
        if (type == Q6_K) {
            for (int64_t i = 0; i < live; i++)
                lanes_step(type, u, dxu[i], xsu[i], acc + i * 8 * LANES, _mm512_loadu_si512(now + i * LANES),
                           _mm512_loadu_si512(now + 256 + i * LANES), s0, s1, mn);
            continue;
        }
        for (int i = 0; i < 16; i++) {  // lanes_step, in registers
            const __m512 prod = _mm512_mul_ps(s0, _mm512_set1_ps(dxu[i]));
            r[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(now + i * LANES)), prod, r[i]);
            if (type == Q4_K) r[i] = _mm512_fmadd_ps(mn, _mm512_set1_ps(xsu[i]), r[i]);
        }
        if (u + GROUP >= units)  // the lane's last unit
            for (int i = 0; i < 16; i++) {
                _mm512_storeu_ps(acc + (i * 8 + u % GROUP) * LANES, r[i]);
                r[i] = _mm512_setzero_ps();
            }
    }
    lanes_store(a, b, m0, live, acc);
}

PG_INLINE void lanes_amx_blocks_of(const LanesAmx *t, const int type, int64_t b_lo, int64_t b_hi) {
    const Args *a = t->a;
    const int64_t units = a->K / UNIT;
    float *scratch = pg_scratch(0, units * (512 / 4 + 3 * LANES + 1) + 16 * 8 * LANES + 3 * 512 + 16);
    float *sw = scratch, *acc = sw + 3 * units * LANES;
    int32_t *sums = (int32_t *)(acc + 16 * 8 * LANES), *order = sums + 3 * 512;
    int8_t *codes = (int8_t *)(order + units);
    for (int64_t k = 0, l = 0, u = 0; k < units; k++) {  // lanes_amx_rows' order (Q6_K: 0, 1, 2, ...)
        order[k] = (int32_t)u;
        u += type == Q6_K ? 1 : GROUP;
        if (u >= units) u = ++l;
    }
    const char *w = (const char *)a->w;
    Prefetch pf = {w + b_lo * LANES * a->row_bytes, w + a->N * a->row_bytes};
    lanes_amx_config(type == Q6_K ? 16 : UNIT);
    for (int64_t b = b_lo; b < b_hi; b++) {
        lanes_amx_stage(a, type, b, codes, sw, &pf);
        for (int64_t m0 = 0; m0 < a->M; m0 += 16) lanes_amx_rows(t, type, b, m0, codes, sw, order, acc, sums);
    }
    _tile_release();
}

static void lanes_amx_task(void *ctx, int64_t task) {
    const LanesAmx *t = (const LanesAmx *)ctx;
    const int64_t blocks = t->a->N / LANES, b_lo = task * t->a->task_rows;
    const int64_t b_hi = b_lo + t->a->task_rows < blocks ? b_lo + t->a->task_rows : blocks;
    switch (t->a->type) {
        case Q4_0: lanes_amx_blocks_of(t, Q4_0, b_lo, b_hi); break;
        case Q5_0: lanes_amx_blocks_of(t, Q5_0, b_lo, b_hi); break;
        case Q8_0: lanes_amx_blocks_of(t, Q8_0, b_lo, b_hi); break;
        case Q4_K: lanes_amx_blocks_of(t, Q4_K, b_lo, b_hi); break;
        default: lanes_amx_blocks_of(t, Q6_K, b_lo, b_hi); break;
    }
}

/* The products on AMX when x has enough rows and the tiles are usable: 1 if it ran them. */
static int lanes_amx_run(Args *a, int num_threads) {
    if (a->M < LANES_AMX_MIN_ROWS || !pg_blocks_amx(-1)) return 0;
    const int64_t padded = (a->M + 15) / 16 * 16, units = a->K / UNIT;
    float *dx = pg_scratch(1, 2 * padded * units + (padded * a->K + 3) / 4);  // the calling thread's slot 1
    float *xs = dx + padded * units;
    int8_t *xq = (int8_t *)(xs + padded * units);
    lanes_x_scales(a, padded, dx, xs);
    memset(xq + a->M / 16 * 16 * a->K, 0, (size_t)((padded - a->M / 16 * 16) * a->K));  // the last tile's rows
    for (int64_t m = 0; m < a->M; m++)  // a tile's 16 rows of a unit in 512 bytes (rows of x: K apart)
        for (int64_t u = 0; u < units; u++)
            memcpy(xq + ((m / 16 * units + u) * 16 + m % 16) * UNIT, a->x.q + m * a->K + u * UNIT, UNIT);
    LanesAmx t = {a, xq, dx, xs, padded};
    pg_parallel(num_threads, (a->N / LANES + a->task_rows - 1) / a->task_rows, lanes_amx_task, &t);
    return 1;
}
#else
static int lanes_amx_run(Args *a, int num_threads) {
    (void)a, (void)num_threads;
    return 0;
}
#endif

/* Every output of a repacked w (a->task_rows: blocks of 16 rows per task here). 0, or -1 where
 * this build has no such path (pg_blocks_interleave says 0). */
int pg_blocks_lanes_run(Args *a, int num_threads) {
    if (!record_of(a->type).words || a->N % LANES) return -1;
    const int64_t blocks = a->N / LANES, per_task = TASK_BYTES / (LANES * a->row_bytes), units = a->K / UNIT;
    a->task_rows = per_task > 1 ? per_task : 1;
    if (lanes_amx_run(a, num_threads)) return 0;
    // x unit by unit (Lanes): the calling thread's scratch slot 1 (AMX's, not run here)
    const int64_t at_all = units * a->M, offset = lanes_offset(a->type);
    float *dx = pg_scratch(1, 4 * at_all + at_all * UNIT / 4), *xs = dx + at_all;
    int32_t *start = (int32_t *)(xs + at_all);
    int8_t *q = (int8_t *)(start + 2 * at_all);
    lanes_x_scales(a, a->M, dx, xs);
    for (int64_t m = 0; m < a->M; m++)
        for (int64_t u = 0; u < units; u++) {
            const int64_t at = u * a->M + m, from = m * a->x.units_padded + u;
            const int8_t *codes = a->x.q + m * a->K + u * UNIT;
            memcpy(q + at * UNIT, codes, UNIT);
            int32_t half = 0;  // Q6_K: each half-unit's share
            if (a->type == Q6_K)
                for (int i = 0; i < 16; i++) half += codes[i];
            start[2 * at] = (int32_t)(-offset * (a->type == Q6_K ? half : a->x.b[from]));
            start[2 * at + 1] = (int32_t)(a->type == Q6_K ? -offset * (a->x.b[from] - half) : 0);
        }
    Lanes c = {a, q, dx, xs, start};
    pg_parallel(num_threads, (blocks + a->task_rows - 1) / a->task_rows, lanes_task, &c);
    return 0;
}
#else
int pg_blocks_lanes_run(Args *a, int num_threads) {
    (void)a, (void)num_threads;
    return -1;
}
#endif
