/* For tests/inference/kernels/test_cpu_kernels.py: simd.h's `vsum` (in registers where the CPU has AVX or
 * AVX-512) against the scalar tree it stands for, lane i + PG_VL / 2 into lane i, then i + PG_VL / 4, ... */
#include "../../../inference/kernels/simd.h"

int pg_test_lanes(void) { return PG_VL; }

/* sums[g] := vsum of v[g * PG_VL ...], tree[g] := the scalar tree's sum of the same lanes. */
void pg_test_lane_sums(const float *v, int64_t num_groups, float *sums, float *tree) {
    for (int64_t g = 0; g < num_groups; g++) {
        vf lanes = vload(v + g * PG_VL);
        sums[g] = vsum(lanes);
        float a[PG_VL];
        memcpy(a, v + g * PG_VL, sizeof a);
        for (int width = PG_VL / 2; width > 0; width /= 2)
            for (int i = 0; i < width; i++) a[i] += a[i + width];
        tree[g] = a[0];
    }
}

/* 1 where this CPU has simd.h's 8-at-once tree and masked stores (`vsum8`, `store_lanes`). */
int pg_test_has_vsum8(void) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
    return 1;
#else
    return 0;
#endif
}

/* sums[g] := `vsum8`'s total of vector g of each 8 (v holds num_groups * 8 vectors), in the
 * order of the vectors. */
void pg_test_vsum8(const float *v, int64_t num_groups, float *sums) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
    for (int64_t g = 0; g < num_groups; g++) {
        __m512 eight[8];
        for (int e = 0; e < 8; e++) eight[e] = _mm512_loadu_ps(v + (g * 8 + e) * 16);
        vsum8(eight, sums + g * 8);
    }
#else
    (void)v, (void)num_groups, (void)sums;
#endif
}

/* out := `store_lanes` of v, `count` lanes per 16 (the rest of out untouched), bias (float32 or
 * bfloat16 per `bias_bf16`, read with `load_lanes`) added first; and want := `store_at` of the same. */
void pg_test_store_lanes(const float *v, const void *bias, int bias_bf16, int64_t n, int count, int out_bf16,
                         void *out, void *want) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
    for (int64_t i = 0; i + 16 <= n; i += 16) {
        __m512 lanes = _mm512_add_ps(_mm512_loadu_ps(v + i), load_lanes(bias, bias_bf16, i, count));
        store_lanes(out, out_bf16, i, lanes, count);
        for (int j = 0; j < count; j++) store_at(want, out_bf16, i + j, v[i + j] + load_at(bias, bias_bf16, i + j));
    }
#else
    (void)v, (void)bias, (void)bias_bf16, (void)n, (void)count, (void)out_bf16, (void)out, (void)want;
#endif
}
