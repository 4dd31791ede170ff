/* Vector types and helpers shared by the CPU kernels (cpu_kernels.c, matmul.c).
 *
 * GCC/Clang vector extensions, so the same source compiles to AVX-512, AVX2 or NEON under
 * -march=native. The library is built without -fassociative-math: every float sum here is
 * added in the order the source writes it. A reduction over many elements keeps PG_VL
 * partial sums (lane l adds elements l, l + PG_VL, ... in order) and adds the lanes in one
 * fixed tree (`vsum`). So a result depends on the numbers and their count only, never on
 * which other rows share a call, how rows are tiled, or which thread ran it: that is what
 * makes the forward pass batch-invariant. The library is also built with -ffp-contract=off: a
 * fused multiply-add happens only where `vfma`/`sfma` say so (the compiler would otherwise fuse
 * some `a * b + c` and not others, depending on how it compiled each copy of a loop).
 */
#ifndef PG_SIMD_H
#define PG_SIMD_H

#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__)
#define PG_VL 16
#else
#define PG_VL 8
#endif

typedef float vf __attribute__((vector_size(PG_VL * 4)));
typedef int32_t vi32 __attribute__((vector_size(PG_VL * 4)));
typedef uint32_t vu32 __attribute__((vector_size(PG_VL * 4)));
typedef uint16_t vu16 __attribute__((vector_size(PG_VL * 2)));
typedef int8_t vi8 __attribute__((vector_size(PG_VL)));
typedef uint8_t vu8 __attribute__((vector_size(PG_VL)));

#define PG_INLINE static inline __attribute__((always_inline))

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#if defined(__AVX512F__) || (defined(__AVX__) && defined(__FMA__))
#define PG_HAS_FMA 1
#endif

/* a * b + c rounded once where the CPU has FMA (x86 AVX2/AVX-512), else a product then a sum:
 * either way the same for every call on one machine. */
PG_INLINE vf vfma(vf a, vf b, vf c) {
#if defined(__AVX512F__)
    return _mm512_fmadd_ps(a, b, c);
#elif defined(PG_HAS_FMA)
    return _mm256_fmadd_ps(a, b, c);
#else
    return a * b + c;
#endif
}

PG_INLINE float sfma(float a, float b, float c) {
#if defined(PG_HAS_FMA)
    return __builtin_fmaf(a, b, c);
#else
    return a * b + c;
#endif
}

PG_INLINE vf vzero(void) { return (vf){0}; }

PG_INLINE vf vsplat(float x) { return vzero() + x; }

PG_INLINE vf vload(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

PG_INLINE void vstore(float *p, vf v) { memcpy(p, &v, sizeof v); }

/* PG_VL bfloat16 values widened to float32 (exact: the bf16 bits are a float32's top half). */
PG_INLINE vf vload_bf16(const uint16_t *p) {
#if defined(__AVX512F__)
    return (vf)_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)p)), 16));
#elif defined(__AVX2__)
    return (vf)_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const void *)p)), 16));
#else
    vu16 h;
    memcpy(&h, p, sizeof h);
    vu32 w = __builtin_convertvector(h, vu32) << 16;
    vf v;
    memcpy(&v, &w, sizeof v);
    return v;
#endif
}

/* PG_VL int8 values widened to 32-bit lanes. (x86 has one instruction for each of these
 * widenings; GCC does not find it for __builtin_convertvector.) */
PG_INLINE vi32 vload_i8_i32(const int8_t *p) {
#if defined(__AVX512F__)
    return (vi32)_mm512_cvtepi8_epi32(_mm_loadu_si128((const void *)p));
#elif defined(__AVX2__)
    return (vi32)_mm256_cvtepi8_epi32(_mm_loadl_epi64((const void *)p));
#else
    vi8 b;
    memcpy(&b, p, sizeof b);
    return __builtin_convertvector(b, vi32);
#endif
}

/* PG_VL int8 values as float32 (exact). */
PG_INLINE vf vload_i8(const int8_t *p) { return __builtin_convertvector(vload_i8_i32(p), vf); }

/* PG_VL bytes widened to 32-bit lanes (their nibbles are picked out by the caller). */
PG_INLINE vi32 vload_u8(const uint8_t *p) {
#if defined(__AVX512F__)
    return (vi32)_mm512_cvtepu8_epi32(_mm_loadu_si128((const void *)p));
#elif defined(__AVX2__)
    return (vi32)_mm256_cvtepu8_epi32(_mm_loadl_epi64((const void *)p));
#else
    vu8 b;
    memcpy(&b, p, sizeof b);
    return __builtin_convertvector(b, vi32);
#endif
}

#if defined(__AVX512BF16__)
/* 32 int8 codes as bfloat16, in order (exact: |code| <= 127): int8 weights for the bfloat16
 * instructions (matmul_amx.c's panels, matmul_avx512bf16.c's tiles). */
PG_INLINE __m512i vbf16_from_i8(const int8_t *p) {
    __m512 low = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const void *)p)));
    __m512 high = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const void *)(p + 16))));
    return (__m512i)_mm512_cvtne2ps_pbh(high, low);
}
#endif

/* Element i of a float32 or bfloat16 array, as float32 (exact). */
PG_INLINE float load_at(const void *p, int is_bf16, int64_t i) {
    if (!is_bf16) return ((const float *)p)[i];
    uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* f as element i of a float32 or bfloat16 array; bfloat16 rounded to nearest even, a NaN kept
 * a (quiet) NaN: c10::BFloat16's conversion. */
PG_INLINE void store_at(void *p, int is_bf16, int64_t i, float f) {
    if (!is_bf16) {
        ((float *)p)[i] = f;
        return;
    }
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        ((uint16_t *)p)[i] = (uint16_t)((u >> 16) | 0x40u);
        return;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
}

/* The lanes of v added in one fixed pairwise tree: lane i + PG_VL / 2 into lane i, then i + PG_VL / 4
 * into i, ... (x86: the same additions in registers; a tile's outputs each end with one). */
PG_INLINE float vsum(vf v) {
#if defined(__AVX512F__)
    __m512 z = (__m512)v;
    __m256 eight = _mm256_add_ps(_mm512_castps512_ps256(z), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(z), 1)));
    __m128 four = _mm_add_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
    __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
    return _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));
#elif defined(__AVX__)
    __m256 y = (__m256)v;
    __m128 four = _mm_add_ps(_mm256_castps256_ps128(y), _mm256_extractf128_ps(y, 1));
    __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
    return _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));
#else
    float a[PG_VL];
    memcpy(a, &v, sizeof a);
    for (int width = PG_VL / 2; width > 0; width /= 2)
        for (int i = 0; i < width; i++) a[i] += a[i + width];
    return a[0];
#endif
}

#if defined(__AVX512F__)
/* `vsum` of 8 vectors at once: the same additions (each level adds the same lane pairs, and a
 * float addition does not depend on its operands' order), 24 instructions instead of 8 x 8.
 * Level 1 puts v[2i]'s and v[2i+1]'s halves side by side, level 2 their quarters, ... */
PG_INLINE void vsum8(const __m512 v[8], float out[8]) {
    __m512 h[4], q[2];
    for (int i = 0; i < 4; i++)  // lanes 0-7: v[2i]'s lane j + lane j+8; 8-15: v[2i+1]'s
        h[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
    for (int i = 0; i < 2; i++)  // 128-bit blocks: v[4i], v[4i+1], v[4i+2], v[4i+3], each j + j+4
        q[i] = _mm512_add_ps(_mm512_shuffle_f32x4(h[2 * i], h[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(h[2 * i], h[2 * i + 1], 0xDD));
    // block b: v[b] (lanes 0-1) and v[4+b] (lanes 2-3), each j + j+2
    __m512 e = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(q[0]), _mm512_castps_pd(q[1]))),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(q[0]), _mm512_castps_pd(q[1]))));
    // block b: lane 0 = v[b]'s total, lane 1 = v[4+b]'s
    __m512 t = _mm512_add_ps(_mm512_shuffle_ps(e, e, 0x88), _mm512_shuffle_ps(e, e, 0xDD));
    float lanes[16];
    _mm512_storeu_ps(lanes, t);
    for (int b = 0; b < 4; b++) out[b] = lanes[4 * b], out[4 + b] = lanes[4 * b + 1];
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__)
/* The first `count` lanes of `v` as elements i..i+count-1 of a float32 or bfloat16 array:
 * `store_at` on 16 lanes at once (the same rounding, the same NaN), in one masked store. */
PG_INLINE void store_lanes(void *p, int is_bf16, int64_t i, __m512 v, int count) {
    const __mmask16 lanes = (__mmask16)((1u << count) - 1);
    if (!is_bf16) {
        _mm512_mask_storeu_ps((float *)p + i, lanes, v);
        return;
    }
    const __m512i u = _mm512_castps_si512(v);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
    rounded = _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(u, _mm512_set1_epi32(0x400000)));
    _mm256_mask_storeu_epi16((uint16_t *)p + i, lanes, _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16)));
}

/* Elements i..i+count-1 of a float32 or bfloat16 array as float32 lanes (exact; the others 0). */
PG_INLINE __m512 load_lanes(const void *p, int is_bf16, int64_t i, int count) {
    const __mmask16 lanes = (__mmask16)((1u << count) - 1);
    if (!is_bf16) return _mm512_maskz_loadu_ps(lanes, (const float *)p + i);
    const __m256i h = _mm256_maskz_loadu_epi16(lanes, (const uint16_t *)p + i);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#endif

/* sum of x[i] * y[i] for i < n: PG_VL lanes in order, then `vsum`, then the tail in order. */
PG_INLINE float dot(const float *x, const float *y, int64_t n) {
    vf acc = vzero();
    int64_t i = 0;
    for (; i + PG_VL <= n; i += PG_VL) acc = vfma(vload(x + i), vload(y + i), acc);
    float total = vsum(acc);
    for (; i < n; i++) total = sfma(x[i], y[i], total);
    return total;
}

/* sum of x[i] for i < n, in the same fixed order. */
PG_INLINE float sum(const float *x, int64_t n) {
    vf acc = vzero();
    int64_t i = 0;
    for (; i + PG_VL <= n; i += PG_VL) acc += vload(x + i);
    float total = vsum(acc);
    for (; i < n; i++) total += x[i];
    return total;
}

#endif
