/* GGML's block formats as the block kernels read them (matmul_blocks.c, matmul_blocks_amx.c): each
 * format's bytes, the integer codes and float scales of a unit of 32 weights (plain C, and AVX2 for
 * the vector paths), x quantized per unit, and a product's arguments and output.
 * Must not know: which path multiplies, models, files.
 */
#ifndef PG_BLOCKS_H
#define PG_BLOCKS_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define PGB_AVX2 1
#endif

#include "simd.h"  // load_at, store_at (and load_lanes, store_lanes for AMX)
#include "threads.h"


enum { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };
#define UNIT 32    // weights per unit: one integer dot product
#define GROUP 8    // units per group: one accumulator step
#define SUPER 256  // weights per K-quant super-block
#if defined(__AVX512F__)
#define MR_MAX 8  // rows of x that share each unpacked weight unit (32 vector registers)
#else
#define MR_MAX 4  // (16 vector registers)
#endif
#define TASK_ROWS 16
/* How far ahead of the weight row being multiplied its bytes are asked for (`prefetcht0`). On the
 * AVX-512 Xeon, memory reads and the arithmetic did not overlap without it: a stream with these
 * kernels' work per byte ran at 1 / (1 / memory rate + 1 / arithmetic rate), 16 GB/s for two
 * threads, and at the memory rate (31 GB/s) once asked for 4-8 KB ahead: the hardware prefetcher
 * does not get that far on its own. */
#define PREFETCH_BYTES 4096
/* Weight bytes per task of the thread pool when x has a few rows (a decode step): a thread reads a
 * task's rows as one stream, asked for ahead (PREFETCH_BYTES), and a new task starts cold (16 rows
 * of a 896-wide Q5_0 matrix were under 10 KB). */
#define TASK_BYTES 65536

/* Bytes of one block and weights per block of each format (0: not a format this file reads). */
PG_INLINE int block_bytes(const int type) {
    switch (type) {
        case Q4_0: return 18;
        case Q4_1: return 20;
        case Q5_0: return 22;
        case Q5_1: return 24;
        case Q8_0: return 34;
        case Q4_K: return 144;
        case Q5_K: return 176;
        case Q6_K: return 210;
        default: return 0;
    }
}
PG_INLINE int block_weights(const int type) { return type >= Q4_K ? SUPER : UNIT; }
PG_INLINE int has_min(const int type) { return type == Q4_1 || type == Q5_1 || type == Q4_K || type == Q5_K; }

/* Bytes of a row of K weights in `type`; -1 if this is not a format read here or K does not fit. */
static inline int64_t row_bytes_of(int type, int64_t K) {
    int bytes = block_bytes(type);
    if (!bytes || K % block_weights(type)) return -1;
    return K / block_weights(type) * bytes;
}

static inline float half_to_float(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) bits = sign | 0x7f800000u | (man << 13);  // inf / NaN
    else if (exp) bits = sign | ((exp + 112) << 23) | (man << 13);
    else if (!man) bits = sign;
    else {  // subnormal: normalise
        exp = 113;
        while (!(man & 0x400)) man <<= 1, exp--;
        bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Q4_K / Q5_K: the 6-bit scale and minimum of sub-block j (ggml's get_scale_min_k4). */
static inline void scale_min_k4(int j, const uint8_t *q, int *sc, int *mn) {
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* ---- the float side of a group: scales, minimums (per weight row, shared by every x row) ---- */

typedef struct {
    float sw[2 * GROUP];  // per lane of each step (Q6_K: two steps)
    float mn[GROUP];      // per unit (formats with a minimum)
} GroupScales;

/* Scales of group g of a row (units u0 .. u0 + count - 1, u0 = g * GROUP); lanes past count: 0. */
static inline void group_scales(int type, const uint8_t *row, int64_t g, int count, GroupScales *s) {
    memset(s, 0, sizeof(*s));
    const int bytes = block_bytes(type);
    if (type >= Q4_K) {  // one super-block per group
        const uint8_t *b = row + g * bytes;
        if (type == Q6_K) {
            const float d = half_to_float(b + 208);
            const int8_t *sc = (const int8_t *)(b + 192);
            for (int l = 0; l < 8; l++) {  // step 0: units 0-3, step 1: units 4-7
                for (int step = 0; step < 2; step++) {
                    int unit = step * 4 + (l & 3), half = l >> 2;
                    int h = unit / 4, t = unit % 4;
                    s->sw[step * 8 + l] = d * (float)sc[8 * h + 2 * t + half];
                }
            }
            return;
        }
        const float d = half_to_float(b), dmin = half_to_float(b + 2);
        for (int u = 0; u < GROUP; u++) {
            int sc, mn;
            scale_min_k4(u, b + 4, &sc, &mn);
            s->sw[u] = d * (float)sc;
            s->mn[u] = -(dmin * (float)mn);
        }
        return;
    }
    for (int u = 0; u < count; u++) {
        const uint8_t *b = row + (g * GROUP + u) * bytes;
        s->sw[u] = half_to_float(b);
        if (has_min(type)) s->mn[u] = half_to_float(b + 2);
    }
}

/* ---- x: each row quantized per unit ---- */

typedef struct {
    const int8_t *q;  // (M, K)
    const float *d;   // (M, units_padded): x ~ d * q
    const float *s;   // (M, units_padded): d * sum(q) of the unit
    const int32_t *b;  // (M, units_padded): sum(q) of the unit
    int64_t units_padded;
    const int8_t *q2;  // (AVX-512) rows 2p and 2p + 1 unit by unit, side by side: unit u of row 2p at 2p * K + 64 u
} QuantizedX;

/* ---- integer codes of one unit (plain C: the reference every path equals) ---- */

/* The codes of unit u of a row: signed (the weight is sw * q) or not (sw * q + mn); returns
 * whether they are signed. */
static inline int unit_codes(int type, const uint8_t *row, int64_t u, int8_t q[UNIT]) {
    const int bytes = block_bytes(type);
    if (type == Q8_0) {
        memcpy(q, row + u * bytes + 2, UNIT);
        return 1;
    }
    if (type <= Q5_1) {
        const uint8_t *b = row + u * bytes;
        const int off = (type == Q4_1 || type == Q5_1) ? 4 : 2;  // after d (and m)
        uint32_t qh = 0;
        const uint8_t *qs = b + off;
        if (type == Q5_0 || type == Q5_1) {
            memcpy(&qh, b + off, 4);
            qs += 4;
        }
        for (int j = 0; j < 16; j++) {
            q[j] = (int8_t)((qs[j] & 0xF) | (((qh >> j) & 1) << 4));
            q[j + 16] = (int8_t)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
        }
        if (type == Q4_0 || type == Q5_0)
            for (int j = 0; j < UNIT; j++) q[j] -= type == Q4_0 ? 8 : 16;
        return type == Q4_0 || type == Q5_0;
    }
    const uint8_t *b = row + (u / GROUP) * bytes;
    const int sub = (int)(u % GROUP);
    if (type == Q6_K) {
        const int h = sub / 4, t = sub % 4;
        const uint8_t *ql = b + 64 * h + 32 * (t & 1), *qh = b + 128 + 32 * h;
        for (int l = 0; l < UNIT; l++) {
            int nib = t < 2 ? ql[l] & 0xF : ql[l] >> 4;
            q[l] = (int8_t)((nib | (((qh[l] >> (2 * t)) & 3) << 4)) - 32);
        }
        return 1;
    }
    const uint8_t *qs = b + (type == Q4_K ? 16 : 48) + 32 * (sub / 2), *qh = b + 16;
    for (int l = 0; l < UNIT; l++) {
        int nib = sub % 2 ? qs[l] >> 4 : qs[l] & 0xF;
        if (type == Q5_K) nib |= ((qh[l] >> sub) & 1) << 4;
        q[l] = (int8_t)nib;
    }
    return 0;
}

/* The 8 lanes of a group's integer sums (see the top: Q6_K's two steps in `second`). */
static inline void group_sums_c(int type, const uint8_t *row, int64_t g, int count, const int8_t *xq, int32_t first[8],
                         int32_t second[8]) {
    memset(first, 0, 8 * sizeof(int32_t));
    memset(second, 0, 8 * sizeof(int32_t));
    for (int u = 0; u < count; u++) {
        int8_t q[UNIT];
        unit_codes(type, row, g * GROUP + u, q);
        const int8_t *xu = xq + (g * GROUP + u) * UNIT;
        int32_t halves[2] = {0, 0};
        for (int i = 0; i < UNIT; i++) halves[i / 16] += (int32_t)q[i] * (int32_t)xu[i];
        if (type == Q6_K) {
            int32_t *lanes = u < 4 ? first : second;
            lanes[u % 4] = halves[0];
            lanes[u % 4 + 4] = halves[1];
        } else first[u] = halves[0] + halves[1];
    }
}

#if defined(PGB_AVX2)
/* ---- the same codes and sums on AVX2 (and VNNI where the CPU has it) ---- */

static inline __m256i bytes_from_bits_32(const uint8_t *p) {  // byte j: 0xFF where bit j is set
    uint32_t bits;
    memcpy(&bits, p, 4);
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    return _mm256_movm_epi8((__mmask32)bits);  // the bits as a mask register: one instruction
#endif
    const __m256i shuffle = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuffle);
    bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
}

static inline __m256i nibbles_32(const uint8_t *qs) {  // 16 bytes -> 32 codes: low nibbles, then high
    __m128i b = _mm_loadu_si128((const __m128i *)qs);
    __m256i both = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
    return _mm256_and_si256(both, _mm256_set1_epi8(0xF));
}

PG_INLINE __m256i unit_codes_avx2(const int type, const uint8_t *row, int64_t u) {
    const int bytes = block_bytes(type);
    const uint8_t *b = row + u * bytes;
    switch (type) {
        case Q8_0: return _mm256_loadu_si256((const __m256i *)(b + 2));
        case Q4_0: return _mm256_sub_epi8(nibbles_32(b + 2), _mm256_set1_epi8(8));
        case Q4_1: return nibbles_32(b + 4);
        case Q5_0:
        case Q5_1: {
            const int off = type == Q5_1 ? 4 : 2;
            __m256i high = _mm256_and_si256(bytes_from_bits_32(b + off), _mm256_set1_epi8(0x10));
            __m256i q = _mm256_or_si256(nibbles_32(b + off + 4), high);
            return type == Q5_0 ? _mm256_sub_epi8(q, _mm256_set1_epi8(16)) : q;
        }
        default: break;
    }
    const uint8_t *s = row + (u / GROUP) * bytes;
    const int sub = (int)(u % GROUP);
    const __m256i low4 = _mm256_set1_epi8(0xF);
    if (type == Q6_K) {
        const int h = sub / 4, t = sub % 4;
        __m256i ql = _mm256_loadu_si256((const __m256i *)(s + 64 * h + 32 * (t & 1)));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(s + 128 + 32 * h));
        __m256i nib = t < 2 ? _mm256_and_si256(ql, low4) : _mm256_and_si256(_mm256_srli_epi16(ql, 4), low4);
        __m256i high = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * t), _mm256_set1_epi8(3));
        __m256i q = _mm256_or_si256(nib, _mm256_slli_epi16(high, 4));
        return _mm256_sub_epi8(q, _mm256_set1_epi8(32));
    }
    __m256i qs = _mm256_loadu_si256((const __m256i *)(s + (type == Q4_K ? 16 : 48) + 32 * (sub / 2)));
    __m256i q = sub % 2 ? _mm256_and_si256(_mm256_srli_epi16(qs, 4), low4) : _mm256_and_si256(qs, low4);
    if (type == Q5_K) {
        __m256i qh = _mm256_loadu_si256((const __m256i *)(s + 16));
        __m256i high = _mm256_and_si256(_mm256_srli_epi16(qh, sub), _mm256_set1_epi8(1));
        q = _mm256_or_si256(q, _mm256_slli_epi16(high, 4));
    }
    return q;
}

/* A stream of weight bytes asked for ahead of where it is read (`prefetcht0`, PREFETCH_BYTES). */
typedef struct {
    const char *next, *end;
} Prefetch;

static inline void prefetch_until(Prefetch *p, const char *until) {
    if (until > p->end) until = p->end;
    for (; p->next < until; p->next += 64) _mm_prefetch(p->next, _MM_HINT_T0);
}

static inline uint16_t half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

static inline __m128i insert_half(__m128i v, const uint8_t *p, int lane) {
    switch (lane) {  // the lane of _mm_insert_epi16 must be a constant
        case 0: return _mm_insert_epi16(v, half_at(p), 0);
        case 1: return _mm_insert_epi16(v, half_at(p), 1);
        case 2: return _mm_insert_epi16(v, half_at(p), 2);
        case 3: return _mm_insert_epi16(v, half_at(p), 3);
        case 4: return _mm_insert_epi16(v, half_at(p), 4);
        case 5: return _mm_insert_epi16(v, half_at(p), 5);
        case 6: return _mm_insert_epi16(v, half_at(p), 6);
        default: return _mm_insert_epi16(v, half_at(p), 7);
    }
}

/* The fp16 at p, p + stride, ... p + 7 stride, as 8 lanes. */
PG_INLINE __m128i half_lanes(const uint8_t *p, int stride) {
    __m128i v = _mm_cvtsi32_si128(half_at(p));
    v = _mm_insert_epi16(v, half_at(p + stride), 1);
    v = _mm_insert_epi16(v, half_at(p + 2 * stride), 2);
    v = _mm_insert_epi16(v, half_at(p + 3 * stride), 3);
    v = _mm_insert_epi16(v, half_at(p + 4 * stride), 4);
    v = _mm_insert_epi16(v, half_at(p + 5 * stride), 5);
    v = _mm_insert_epi16(v, half_at(p + 6 * stride), 6);
    return _mm_insert_epi16(v, half_at(p + 7 * stride), 7);
}

/* The scales of group g as vectors (the same floats as group_scales): sw (Q6_K: sw and sw2, its
 * two steps) and, for formats with a minimum, mn. */
PG_INLINE void group_scales_avx2(const int type, const uint8_t *row, int64_t g, int count, __m256 *sw, __m256 *sw2,
                                 __m256 *mn) {
    const int bytes = block_bytes(type);
    if (type == Q6_K) {
        const uint8_t *b = row + g * bytes;
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(*(const uint16_t *)(b + 208)));
        const __m128i order = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
        __m128i sc = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(b + 192)), order);
        *sw = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
        *sw2 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))));
        return;
    }
    if (type == Q4_K || type == Q5_K) {
        const uint8_t *b = row + g * bytes;
        // scale_min_k4 for the 8 units at once, on the 12 bytes as 3 words (llama.cpp's masks):
        // bytes 0-7 of the result are the scales, 8-15 the minimums (the same integers)
        uint32_t k[3], t[4];
        memcpy(k, b + 4, 12);
        t[0] = k[0] & 0x3f3f3f3f;
        t[1] = (k[2] & 0x0f0f0f0f) | (((k[0] >> 6) & 0x03030303) << 4);
        t[2] = k[1] & 0x3f3f3f3f;
        t[3] = ((k[2] >> 4) & 0x0f0f0f0f) | (((k[1] >> 6) & 0x03030303) << 4);
        const __m128i both = _mm_setr_epi32((int)t[0], (int)t[1], (int)t[2], (int)t[3]);
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(*(const uint16_t *)b));
        const __m256 dmin = _mm256_set1_ps(_cvtsh_ss(*(const uint16_t *)(b + 2)));
        *sw = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(both)));
        __m256 mins = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(both, 8))));
        *mn = _mm256_xor_ps(mins, _mm256_set1_ps(-0.0f));
        return;
    }
    // the blocks' fp16 scales put into one vector in registers (a vector loaded from 2-byte
    // stores just made stalls on the failed store forwarding: 40% of a decode matmul's time)
    const uint8_t *b = row + g * GROUP * bytes;
    __m128i d = _mm_setzero_si128(), m = _mm_setzero_si128();
    if (count == GROUP) {
        d = half_lanes(b, bytes);
        if (has_min(type)) m = half_lanes(b + 2, bytes);
    } else {
        for (int u = 0; u < count; u++) {
            d = insert_half(d, b + u * bytes, u);
            if (has_min(type)) m = insert_half(m, b + u * bytes + 2, u);
        }
    }
    *sw = _mm256_cvtph_ps(d);
    if (has_min(type)) *mn = _mm256_cvtph_ps(m);
}

/* 8 lanes, each the sum of 4 products of unsigned a and signed b bytes (exact: a <= 128). */
static inline __m256i dot_u8_i8(__m256i a, __m256i b) {
#if defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), a, b);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
#endif
}

/* A group's sums for MR rows of x, as group_sums_c gives them. */
/* Sums of units u and u + 1 for every row: their 8-lane dot products, horizontally added in pairs. */
/* Signed codes multiplied as q + offset (unsigned) with the offset's share, offset * sum(xq), taken
 * off each unit's sum afterwards: the same exact integer, two instructions less per unit and row
 * than the sign trick. 0: the sign trick (Q6_K's scales cover half-units; Q8_0's codes + 128 would
 * overflow `maddubs`' 16-bit pairs, so only with VNNI). */
PG_INLINE int code_offset(const int type) {
    if (type == Q4_0) return 8;
    if (type == Q5_0) return 16;
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
    if (type == Q8_0) return 128;
#endif
    return 0;
}

PG_INLINE void unit_pair(const int type, const uint8_t *row, int64_t g, int count, int u, const int8_t *xq, int64_t K,
                         const int MR, __m256i pair[MR_MAX]) {
    const int offset = code_offset(type), is_signed = !has_min(type) && !offset;
    __m256i d[2][MR_MAX];
    for (int v = 0; v < 2; v++) {
        if (u + v >= count) {
            for (int i = 0; i < MR; i++) d[v][i] = _mm256_setzero_si256();
            continue;
        }
        __m256i q = unit_codes_avx2(type, row, g * GROUP + u + v);
        if (offset) q = _mm256_add_epi8(q, _mm256_set1_epi8((char)offset));  // q + offset, as unsigned bytes
        __m256i a = is_signed ? _mm256_sign_epi8(q, q) : q;  // |q| (the unsigned side)
        for (int i = 0; i < MR; i++) {
            __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + i * K + (g * GROUP + u + v) * UNIT));
            d[v][i] = dot_u8_i8(a, is_signed ? _mm256_sign_epi8(xv, q) : xv);
        }
    }
    for (int i = 0; i < MR; i++) pair[i] = _mm256_hadd_epi32(d[0][i], d[1][i]);
}

/* The group's 8 units unpacked once, then per row of x their 8 dot products reduced together, as
 * unit_pair and group_sums_avx2 reduce them (the same lanes: the sums are exact). */
PG_INLINE void group_sums_by_row(const int type, const uint8_t *row, int64_t g, int count, const int8_t *xq,
                                 int64_t K, const int MR, __m256i h[2][MR_MAX]) {
    const int offset = code_offset(type), is_signed = !has_min(type) && !offset;
    __m256i a[GROUP], q[GROUP];
    for (int v = 0; v < GROUP; v++) {
        if (v >= count) {
            a[v] = q[v] = _mm256_setzero_si256();
            continue;
        }
        q[v] = unit_codes_avx2(type, row, g * GROUP + v);
        if (offset) q[v] = _mm256_add_epi8(q[v], _mm256_set1_epi8((char)offset));  // q + offset, as unsigned bytes
        a[v] = is_signed ? _mm256_sign_epi8(q[v], q[v]) : q[v];  // |q| (the unsigned side)
    }
    for (int i = 0; i < MR; i++) {
        __m256i d[GROUP];
        for (int v = 0; v < GROUP; v++) {
            if (v >= count) {
                d[v] = _mm256_setzero_si256();
                continue;
            }
            __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + i * K + (g * GROUP + v) * UNIT));
            d[v] = dot_u8_i8(a[v], is_signed ? _mm256_sign_epi8(xv, q[v]) : xv);
        }
        for (int half = 0; half < 2; half++)
            h[half][i] = _mm256_hadd_epi32(_mm256_hadd_epi32(d[4 * half], d[4 * half + 1]),
                                           _mm256_hadd_epi32(d[4 * half + 2], d[4 * half + 3]));
    }
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define PGB_PAIRS 1
/* group_sums_avx2's `first` for an even number of rows of x, two rows at a time on 512-bit
 * vectors (matmul_blocks.c's tile_avx2): a unit's codes in both halves, rows 2p and 2p + 1 side by
 * side (x.q2), so one `vpdpbusd`, one reduction and one offset step serve two rows (8 rows of Q5_0:
 * 1.26x). The sums are exact, so how they are added up does not matter; the lanes are
 * group_sums_avx2's. Unsigned codes only (q + offset, or a format with a minimum): there is no
 * 512-bit `vpsignb`. pair_codes: the group's codes (+ offset), each unit in both halves. */
PG_INLINE void pair_codes(const int type, const uint8_t *row, int64_t g, int count, __m512i a[GROUP]) {
    const int offset = code_offset(type);
    for (int v = 0; v < GROUP; v++) {
        if (v >= count) {
            a[v] = _mm512_setzero_si512();
            continue;
        }
        __m256i q = unit_codes_avx2(type, row, g * GROUP + v);
        if (offset) q = _mm256_add_epi8(q, _mm256_set1_epi8((char)offset));
        a[v] = _mm512_broadcast_i64x4(q);
    }
}

/* Rows i and i + 1's `first` (the low and high 256 bits) from the group's codes `a`. */
PG_INLINE __m512i pair_sums(const int type, const __m512i a[GROUP], int64_t g, int count, const int8_t *xq2, int64_t K,
                            const int32_t *xb, int64_t up, int i) {
    const int offset = code_offset(type);
    const int8_t *xp = xq2 + i * K + g * GROUP * 2 * UNIT;
    __m512i d[GROUP], s[2];
    for (int v = 0; v < GROUP; v++)
        d[v] = v < count ? _mm512_dpbusd_epi32(_mm512_setzero_si512(), a[v], _mm512_loadu_si512(xp + v * 2 * UNIT))
                         : _mm512_setzero_si512();
    for (int half = 0; half < 2; half++) {  // per 128-bit lane: units 4 half .. 4 half + 3's sums
        const __m512i *e = d + 4 * half;
        __m512i t01 = _mm512_add_epi32(_mm512_unpacklo_epi32(e[0], e[1]), _mm512_unpackhi_epi32(e[0], e[1]));
        __m512i t23 = _mm512_add_epi32(_mm512_unpacklo_epi32(e[2], e[3]), _mm512_unpackhi_epi32(e[2], e[3]));
        s[half] = _mm512_add_epi32(_mm512_unpacklo_epi64(t01, t23), _mm512_unpackhi_epi64(t01, t23));
    }
    // 128-bit lanes of s[h]: [row i: L0, L1 | row i + 1: L0, L1]; a row's first: [L0 + L1 of s[0] | of s[1]]
    __m512i lo = _mm512_shuffle_i32x4(s[0], s[1], 0x88), hi = _mm512_shuffle_i32x4(s[0], s[1], 0xDD);
    __m512i f = _mm512_add_epi32(lo, hi);
    f = _mm512_shuffle_i32x4(f, f, 0xD8);
    if (offset) {  // the offset's share: offset * sum(xq) of each unit (offsets are powers of 2)
        const int shift = offset == 8 ? 3 : offset == 16 ? 4 : 7;
        __m256i s0 = _mm256_loadu_si256((const __m256i *)(xb + i * up + g * GROUP));
        __m256i s1 = _mm256_loadu_si256((const __m256i *)(xb + (i + 1) * up + g * GROUP));
        f = _mm512_sub_epi32(f, _mm512_slli_epi32(_mm512_inserti64x4(_mm512_castsi256_si512(s0), s1, 1), shift));
    }
    return f;
}

#endif

/* A group's sums for MR rows of x, as group_sums_c gives them (unsigned codes on AVX-512, MR even:
 * pair_sums instead). By row (group_sums_by_row) for one row of x and for Q6_K (on the AVX-512
 * Xeon: Q5_0's decode product 1.25x, Q6_K's 8-row one 1.2x; the AVX2 build there: Q6_K's 8 rows
 * 1.13x, one row unchanged), or reduced as they come, so a row holds two or three vectors at a
 * time (Q8_0, whose codes are one load, was a little slower by row). */
PG_INLINE void group_sums_avx2(const int type, const uint8_t *row, int64_t g, int count, const int8_t *xq, int64_t K,
                               const int32_t *xb, int64_t up, const int MR, __m256i first[MR_MAX],
                               __m256i second[MR_MAX]) {
    __m256i h[2][MR_MAX];
    if (type != Q8_0 && (MR == 1 || type == Q6_K)) group_sums_by_row(type, row, g, count, xq, K, MR, h);
    else
        for (int half = 0; half < 2; half++) {  // units 0-3, then 4-7
            __m256i p0[MR_MAX], p1[MR_MAX];
            unit_pair(type, row, g, count, 4 * half, xq, K, MR, p0);
            unit_pair(type, row, g, count, 4 * half + 2, xq, K, MR, p1);
            // [unit 0-3 first halves | unit 0-3 second halves] (of this half of the group)
            for (int i = 0; i < MR; i++) h[half][i] = _mm256_hadd_epi32(p0[i], p1[i]);
        }
    for (int i = 0; i < MR; i++) {
        if (type == Q6_K) {
            first[i] = h[0][i];
            second[i] = h[1][i];
            continue;
        }
        __m128i s0 = _mm_add_epi32(_mm256_castsi256_si128(h[0][i]), _mm256_extracti128_si256(h[0][i], 1));
        __m128i s1 = _mm_add_epi32(_mm256_castsi256_si128(h[1][i]), _mm256_extracti128_si256(h[1][i], 1));
        first[i] = _mm256_set_m128i(s1, s0);
        if (code_offset(type)) {  // the offset's share: offset * sum(xq) of each unit (0 past the row's end)
            __m256i share = _mm256_mullo_epi32(_mm256_loadu_si256((const __m256i *)(xb + i * up + g * GROUP)),
                                               _mm256_set1_epi32(code_offset(type)));
            first[i] = _mm256_sub_epi32(first[i], share);
        }
    }
}
#endif

/* An AMX tile configuration (`ldtilecfg`'s 64 bytes, palette 1): rows and bytes per row of each
 * tile (matmul_blocks_amx.c, matmul_blocks_lanes.c). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

typedef struct {
    float lane[8];
} Acc;

static inline inline void acc_step(Acc *acc, const int32_t sums[8], const float sw[8], const float *dx) {
    for (int l = 0; l < 8; l++) acc->lane[l] = fmaf((float)sums[l], sw[l] * dx[l], acc->lane[l]);
}

static inline inline void acc_min(Acc *acc, const float mn[8], const float *xs) {
    for (int l = 0; l < 8; l++) acc->lane[l] = fmaf(mn[l], xs[l], acc->lane[l]);
}

static inline inline float hsum8(const Acc *a) {  // the tree of AVX2's extract / movehl / shuffle
    const float *v = a->lane;
    float s0 = v[0] + v[4], s1 = v[1] + v[5], s2 = v[2] + v[6], s3 = v[3] + v[7];
    return (s0 + s2) + (s1 + s3);
}

/* Q6_K's dx per lane: lane l < 4 is unit l's (of the step), lane l >= 4 unit l - 4's. */
static inline inline void q6k_dx(const float *dx_units, float out[8]) {
    for (int l = 0; l < 8; l++) out[l] = dx_units[l & 3];
}

typedef struct {
    QuantizedX x;
    int64_t M, K, N;
    int type;
    const uint8_t *w;
    int64_t row_bytes;
    const void *bias;
    int bias_bf16;
    void *out;
    int64_t ldc;
    int out_bf16;
    int64_t task_rows;  // weight rows per task of the thread pool (matmul_blocks.c: task_rows_of)
} Args;

static inline void store(const Args *a, int64_t m, int64_t n, float v) {
    if (a->bias) v += load_at(a->bias, a->bias_bf16, n);
    store_at(a->out, a->out_bf16, m * a->ldc + n, v);  // one rounding to out's dtype
}

#endif
