/* For tests/engine/test_cpu_kernels.py: simd.h's `vsum` (in registers where the CPU has AVX or
 * AVX-512) against the scalar tree it stands for, lane i + PG_VL / 2 into lane i, then i + PG_VL / 4, ... */
#include "../../inference/kernels/simd.h"

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
