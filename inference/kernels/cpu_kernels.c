/* Fused CPU kernels for the Llama-family forward pass and for the read-outs of each step's
 * distribution (inference/kernels/cpu.py builds and loads this file with matmul.c and threads.c;
 * inference/models/fused.py and inference/sampling/sampler.py call it).
 *
 * Why: at one token per step every op is a dispatch plus a tiny computation. Between the four
 * matrix multiplies of a layer, torch spends ~25 small ops (casts, norms, rotary, cache writes,
 * attention views), each ~1.5-2 us on this CPU, which is more than the int4 matmuls themselves.
 * Each function here does one of those stretches in one call, reading and writing the tensors in
 * place. The math is torch's (float32 statistics and accumulation); only rounding order differs,
 * and that order is fixed per row (simd.h): a row's result never depends on the other rows of
 * the call, so prompt rows and decode rows, alone or batched, get the same numbers.
 *
 * Tensors are float32 or bfloat16 (`*_bf16` flags). The residual stream `h` is float32 (the
 * matmuls read bfloat16 copies). The attention splits its rows over the thread pool
 * (threads.c); the other kernels here are short and run on the calling thread.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"
#include "threads.h"

static inline float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even, NaN kept a (quiet) NaN: c10::BFloat16's conversion. */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static void load_row(const void *src, int is_bf16, float *dst, int64_t n) {
    if (!is_bf16) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    const uint16_t *s = (const uint16_t *)src;
    for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(s[i]);
}

static void store_row(const float *src, void *dst, int is_bf16, int64_t n) {
    if (!is_bf16) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    uint16_t *d = (uint16_t *)dst;
    for (int64_t i = 0; i < n; i++) d[i] = f32_to_bf16(src[i]);
}

static inline size_t elem(int is_bf16) { return is_bf16 ? 2 : 4; }

/* exp for float32, branch-free so loops over it vectorize (Cephes' expf polynomial, ~1 ulp on
 * the clamped range; exp(-87.3) ~ 1e-38 stands in for 0 below it). */
static inline float fast_expf(float x) {
    x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
    float n = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return p * scale;
}

/* For each of `rows` rows: h += delta (when delta is not NULL), then
 * out = h / sqrt(mean(h^2) + eps) * weight, rounded once to out's dtype.
 * h (rows, dim) float32; delta (rows, dim); weight (dim,) float32; out (rows, dim). */
void pg_add_rms_norm(float *h, const void *delta, int delta_bf16, const float *weight, void *out, int out_bf16,
                     int64_t rows, int64_t dim, float eps) {
    float *tmp = (float *)malloc((size_t)dim * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        float *x = h + r * dim;
        if (delta) {
            load_row((const char *)delta + (size_t)(r * dim) * elem(delta_bf16), delta_bf16, tmp, dim);
            for (int64_t i = 0; i < dim; i++) x[i] += tmp[i];
        }
        float inv = 1.0f / sqrtf(dot(x, x, dim) / (float)dim + eps);
        for (int64_t i = 0; i < dim; i++) tmp[i] = x[i] * inv * weight[i];
        store_row(tmp, (char *)out + (size_t)(r * dim) * elem(out_bf16), out_bf16, dim);
    }
    free(tmp);
}

typedef struct {
    const void *gate_up;
    void *out;
    int in_bf16, out_bf16;
    int64_t inter;
} SiluMul;

static void silu_mul_task(void *ctx, int64_t r) {
    const SiluMul *a = (const SiluMul *)ctx;
    float *g = pg_scratch(0, 2 * a->inter);
    load_row((const char *)a->gate_up + (size_t)(r * 2 * a->inter) * elem(a->in_bf16), a->in_bf16, g, 2 * a->inter);
    const float *u = g + a->inter;
    for (int64_t i = 0; i < a->inter; i++) g[i] = g[i] / (1.0f + fast_expf(-g[i])) * u[i];
    store_row(g, (char *)a->out + (size_t)(r * a->inter) * elem(a->out_bf16), a->out_bf16, a->inter);
}

/* out = silu(gate) * up for rows of gate_up = [gate | up] (rows, 2 * inter) -> out (rows, inter),
 * a row per task (a batch's 8 rows: 1.3 ms a step on one thread). */
void pg_silu_mul(const void *gate_up, int in_bf16, void *out, int out_bf16, int64_t rows, int64_t inter,
                 int num_threads) {
    SiluMul a = {gate_up, out, in_bf16, out_bf16, inter};
    pg_parallel(rows > 1 ? num_threads : 1, rows, silu_mul_task, &a);
}

/* The rotary embedding of one head x (D,) with cos/sin (D,) into rot (D,): rotate_half's formula
 * (x * cos + [-x2, x1] * sin). Always inlined, for a constant D at its callers. */
static inline __attribute__((always_inline)) void rotate_head(const float *restrict x, const float *restrict c,
                                                              const float *restrict s, float *restrict rot,
                                                              const int64_t D) {
    const int64_t half = D / 2;
    for (int64_t i = 0; i < half; i++) {
        rot[i] = x[i] * c[i] - x[i + half] * s[i];
        rot[i + half] = x[i + half] * c[i + half] + x[i] * s[i + half];
    }
}

/* The rotary embedding of q and k, then k and v into the cache.
 * qkv (T, (H + 2 KVH) * D): each row [q heads | k heads | v heads]; cos/sin (T, D) float32 at
 * each row's position; q_out (T, H, D) float32. The cache is addressed by slot: head `j` of the
 * token in `slots[t]` lives at base + slots[t] * slot_stride + j * head_stride (elements). */
void pg_rope_write_kv(const void *qkv, int qkv_bf16, const float *cos, const float *sin, float *q_out,
                      void *k_base, void *v_base, int kv_bf16, const int64_t *slots, int64_t slot_stride,
                      int64_t head_stride, int64_t T, int64_t H, int64_t KVH, int64_t D) {
    int64_t width = (H + 2 * KVH) * D;
    float *row = (float *)malloc((size_t)width * sizeof(float));
    float *rot = (float *)malloc((size_t)D * sizeof(float));
    size_t kv_elem = elem(kv_bf16);
    for (int64_t t = 0; t < T; t++) {
        load_row((const char *)qkv + (size_t)(t * width) * elem(qkv_bf16), qkv_bf16, row, width);
        const float *c = cos + t * D, *s = sin + t * D;
        for (int64_t j = 0; j < H + KVH; j++) {
            float *dst = j < H ? q_out + (t * H + j) * D : rot;
            if (D == 64) rotate_head(row + j * D, c, s, dst, 64);
            else if (D == 128) rotate_head(row + j * D, c, s, dst, 128);
            else rotate_head(row + j * D, c, s, dst, D);
            if (j >= H) {
                size_t at = (size_t)(slots[t] * slot_stride + (j - H) * head_stride) * kv_elem;
                store_row(rot, (char *)k_base + at, kv_bf16, D);
            }
        }
        for (int64_t j = 0; j < KVH; j++) {
            size_t at = (size_t)(slots[t] * slot_stride + j * head_stride) * kv_elem;
            store_row(row + (H + KVH + j) * D, (char *)v_base + at, kv_bf16, D);
        }
    }
    free(rot);
    free(row);
}

/* PG_VL keys or values (float32 or bfloat16 cache) as float32. */
PG_INLINE vf vload_kv(const char *p, const int is_bf16) {
    return is_bf16 ? vload_bf16((const uint16_t *)p) : vload((const float *)p);
}

PG_INLINE float load_kv(const char *p, const int is_bf16, int64_t i) {
    return is_bf16 ? bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* Four dot products q . k[r] (D,), each with exactly `dot`'s sequence of operations (so a
 * score is the same computed in a block of four or alone): four at once only hide the
 * latency of each one's chain of multiply-adds. */
PG_INLINE void dot4(const float *restrict q, const char *const k[4], const int kv_bf16, const int64_t D,
                    float out[4]) {
    vf acc[4] = {vzero(), vzero(), vzero(), vzero()};
    int64_t d = 0;
    for (; d + PG_VL <= D; d += PG_VL) {
        vf qv = vload(q + d);
        for (int r = 0; r < 4; r++) acc[r] = vfma(qv, vload_kv(k[r] + d * (kv_bf16 ? 2 : 4), kv_bf16), acc[r]);
    }
    for (int r = 0; r < 4; r++) {
        float total = vsum(acc[r]);
        for (int64_t t = d; t < D; t++) total = sfma(q[t], load_kv(k[r], kv_bf16, t), total);
        out[r] = total;
    }
}

#if defined(__AVX512F__)
/* Eight of them where D is a whole number of vectors: the same multiply-adds, and their eight
 * lane trees summed at once (`vsum8`: `vsum`'s additions), a third of a score's instructions. */
PG_INLINE void dot8(const float *restrict q, const char *const k[8], const int kv_bf16, const int64_t D,
                    float out[8]) {
    __m512 acc[8];
    for (int r = 0; r < 8; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += PG_VL) {
        const vf qv = vload(q + d);
        for (int r = 0; r < 8; r++)
            acc[r] = (__m512)vfma(qv, vload_kv(k[r] + d * (kv_bf16 ? 2 : 4), kv_bf16), (vf)acc[r]);
    }
    vsum8(acc, out);
}
#endif

PG_INLINE float dot_kv(const float *restrict q, const char *k, const int kv_bf16, const int64_t D) {
    vf acc = vzero();
    int64_t d = 0;
    for (; d + PG_VL <= D; d += PG_VL) acc = vfma(vload(q + d), vload_kv(k + d * (kv_bf16 ? 2 : 4), kv_bf16), acc);
    float total = vsum(acc);
    for (; d < D; d++) total = sfma(q[d], load_kv(k, kv_bf16, d), total);
    return total;
}

/* The scores of positions p..p+N-1 for each head of the group (N = 8: `dot8`, AVX-512 and D a
 * whole number of vectors; N = 4: `dot4`), scaled. */
PG_INLINE void score_block(const int N, const float *restrict qg, const char *k_head, const int kv_bf16,
                           const int64_t *seq_slots, int64_t p, int64_t L, int64_t slot_bytes, int64_t group,
                           const int64_t D, float scale, float *restrict scores) {
    const char *k[8];
    for (int r = 0; r < N; r++) k[r] = k_head + (seq_slots ? seq_slots[p + r] : p + r) * slot_bytes;
    for (int64_t g = 0; g < group; g++) {
        float dots[8];
#if defined(__AVX512F__)
        if (N == 8) dot8(qg + g * D, k, kv_bf16, D, dots);
        else
#endif
            dot4(qg + g * D, k, kv_bf16, D, dots);
        for (int r = 0; r < N; r++) scores[g * L + p + r] = dots[r] * scale;
    }
}

/* One query row's heads of one KV group, qg (group, D), over its L cached positions -> acc
 * (group, D). Every sum's order depends on D and L only (never on other rows, the blocking of
 * a prompt or the thread), so a position gets the same output whether it is computed in a
 * prompt, a prompt chunk or a decode step: prompts and decodes share this one function.
 * Keys and values are read once per position for the whole group. Always inlined, so callers
 * get copies specialised for a constant head size and cache dtype. */
PG_INLINE void attend_group(const float *restrict qg, const char *k_head, const char *v_head, const int kv_bf16,
                            const int64_t *seq_slots, int64_t L, int64_t slot_bytes, int64_t group, const int64_t D,
                            float scale, float *restrict scores, float *restrict acc) {
    // every position's key and value lines asked for first: a decode step's cache rows come from
    // memory (the weights' stream has pushed them out since the last step), at slots the hardware
    // prefetcher cannot guess
    const int64_t head_bytes = D * (kv_bf16 ? 2 : 4);
    for (int64_t t = 0; t < L; t++) {
        const int64_t at = (seq_slots ? seq_slots[t] : t) * slot_bytes;
        for (int64_t b = 0; b < head_bytes; b += 64) {
            __builtin_prefetch(k_head + at + b, 0, 3);
            __builtin_prefetch(v_head + at + b, 0, 3);
        }
    }
    int64_t p = 0;
#if defined(__AVX512F__)
    for (; D % PG_VL == 0 && p + 8 <= L; p += 8)
        score_block(8, qg, k_head, kv_bf16, seq_slots, p, L, slot_bytes, group, D, scale, scores);
#endif
    for (; p + 4 <= L; p += 4)
        score_block(4, qg, k_head, kv_bf16, seq_slots, p, L, slot_bytes, group, D, scale, scores);
    for (; p < L; p++) {
        const char *k = k_head + (seq_slots ? seq_slots[p] : p) * slot_bytes;
        for (int64_t g = 0; g < group; g++) scores[g * L + p] = dot_kv(qg + g * D, k, kv_bf16, D) * scale;
    }
    for (int64_t g = 0; g < group; g++) {  // softmax in float32, the maximum subtracted
        float *restrict sg = scores + g * L, peak = -INFINITY;
        for (int64_t t = 0; t < L; t++) peak = sg[t] > peak ? sg[t] : peak;
        for (int64_t t = 0; t < L; t++) sg[t] = fast_expf(sg[t] - peak);
        float inv = L > 0 ? 1.0f / sum(sg, L) : 0.0f;
        for (int64_t t = 0; t < L; t++) sg[t] *= inv;
    }
    enum { MAX_ACC = PG_VL == 16 ? 16 : 8 };  // of 32 vector registers (AVX-512), of 16 (AVX2)
    if ((D == 64 || D == 128) && D / PG_VL <= MAX_ACC) {
        // The same sums (each output element adds its positions in order), in up to MAX_ACC
        // registers: a few heads of the group at a time (AVX-512: 4 heads of 64, 2 of 128), each
        // pass over the positions reading their values once. Through memory (below), each
        // position cost every accumulator a load and a store: attention took ~2x as long.
        const int per_head = (int)(D / PG_VL), heads = MAX_ACC / per_head;
        for (int64_t g0 = 0; g0 < group; g0 += heads) {
            const int num_heads = group - g0 < heads ? (int)(group - g0) : heads;
            vf sums[MAX_ACC];
            for (int i = 0; i < MAX_ACC; i++) sums[i] = vzero();
            for (int64_t t = 0; t < L; t++) {
                const char *v = v_head + (seq_slots ? seq_slots[t] : t) * slot_bytes;
                for (int h = 0; h < num_heads; h++) {
                    const vf score = vsplat(scores[(g0 + h) * L + t]);
                    for (int j = 0; j < per_head; j++)
                        sums[h * per_head + j] = vfma(score, vload_kv(v + j * PG_VL * (kv_bf16 ? 2 : 4), kv_bf16),
                                                      sums[h * per_head + j]);
                }
            }
            for (int h = 0; h < num_heads; h++)
                for (int j = 0; j < per_head; j++) vstore(acc + (g0 + h) * D + j * PG_VL, sums[h * per_head + j]);
        }
        return;
    }
    memset(acc, 0, (size_t)(group * D) * sizeof(float));
    for (int64_t t = 0; t < L; t++) {  // each output element adds its positions in order
        const char *v = v_head + (seq_slots ? seq_slots[t] : t) * slot_bytes;
        int64_t d = 0;
        for (; d + PG_VL <= D; d += PG_VL) {
            vf vv = vload_kv(v + d * (kv_bf16 ? 2 : 4), kv_bf16);
            for (int64_t g = 0; g < group; g++)
                vstore(acc + g * D + d, vfma(vsplat(scores[g * L + t]), vv, vload(acc + g * D + d)));
        }
        for (; d < D; d++)
            for (int64_t g = 0; g < group; g++) acc[g * D + d] = sfma(scores[g * L + t], load_kv(v, kv_bf16, d), acc[g * D + d]);
    }
}

typedef struct {
    const float *q;
    const void *k_base, *v_base;
    int kv_bf16, out_bf16;
    const int64_t *slots, *starts, *lengths;
    int64_t slot_bytes, head_stride, H, KVH, D, longest;
    float scale;
    void *out;
} AttentionArgs;

/* One task: row b's heads of KV head j (task = b * KVH + j). */
static void attention_task(void *ctx, int64_t task) {
    const AttentionArgs *a = (const AttentionArgs *)ctx;
    int64_t b = task / a->KVH, j = task % a->KVH, group = a->H / a->KVH, D = a->D;
    int64_t kv_elem = (int64_t)elem(a->kv_bf16);
    float *scores = pg_scratch(2, group * a->longest), *acc = pg_scratch(3, group * D);
    const int64_t *seq_slots = a->slots ? a->slots + a->starts[b] : NULL;
    const float *qg = a->q + (b * a->H + j * group) * D;  // the group's query heads, (group, D)
    const char *k_head = (const char *)a->k_base + j * a->head_stride * kv_elem;
    const char *v_head = (const char *)a->v_base + j * a->head_stride * kv_elem;
    int64_t L = a->lengths[b];
#define ATTEND(BF16, DIM) attend_group(qg, k_head, v_head, BF16, seq_slots, L, a->slot_bytes, group, DIM, a->scale, scores, acc)
    if (a->kv_bf16 && D == 64) ATTEND(1, 64);
    else if (a->kv_bf16 && D == 128) ATTEND(1, 128);
    else if (!a->kv_bf16 && D == 64) ATTEND(0, 64);
    else if (!a->kv_bf16 && D == 128) ATTEND(0, 128);
    else ATTEND(a->kv_bf16, D);
#undef ATTEND
    for (int64_t g = 0; g < group; g++) {
        size_t at = (size_t)((b * a->H + j * group + g) * D) * elem(a->out_bf16);
        store_row(acc + g * D, (char *)a->out + at, a->out_bf16, D);
    }
}

/* Attention of B query rows, each over its own cached positions (grouped-query heads): the one
 * kernel for decode steps and prompt rows alike.
 * q (B, H, D) float32; row b attends to lengths[b] positions, position p in slot
 * slots[starts[b] + p] (slots NULL: slot p), so the rows of one prompt chunk share its slots
 * with lengths start + 1, start + 2, ...; out (B, H, D). Keys are read once per position for
 * every query head of their group. (row, KV head) pairs are tasks of the thread pool. */
void pg_attention(const float *q, const void *k_base, const void *v_base, int kv_bf16, const int64_t *slots,
                  const int64_t *starts, const int64_t *lengths, int64_t slot_stride, int64_t head_stride, int64_t B,
                  int64_t H, int64_t KVH, int64_t D, float scale, void *out, int out_bf16, int num_threads) {
    int64_t longest = 1, work = 0;
    for (int64_t b = 0; b < B; b++) {
        longest = lengths[b] > longest ? lengths[b] : longest;
        work += lengths[b];
    }
    if (work * KVH * D < (1 << 16)) num_threads = 1;  // waking a helper costs more than this
    AttentionArgs a = {q,     k_base, v_base, kv_bf16, out_bf16, slots, starts, lengths, slot_stride * (int64_t)elem(kv_bf16),
                       head_stride, H, KVH, D, longest, scale, out};
    pg_parallel(num_threads, B * KVH, attention_task, &a);
}

/* ---- read-outs of one next-token distribution (every step reports them) -------------------- */

/* The k largest values seen so far, largest first, ties in index order; filled block by block
 * (top_k_block), blocks of 64 from index 0. */
typedef struct {
    int64_t k, count, *ids;
    float kth, *values;
} TopK;

/* Values x[start .. end) (a block of at most 64). A block whose values are all below the current
 * k-th is skipped with one vectorised compare, so a pass over a 49k vocabulary costs about one
 * read of it. A NaN is never chosen. */
static inline void top_k_block(TopK *t, const float *x, int64_t start, int64_t end) {
    if (t->count == t->k) {
        int any = 0;
        for (int64_t i = start; i < end; i++) any |= x[i] > t->kth;
        if (!any) return;
    }
    for (int64_t i = start; i < end; i++) {
        float v = x[i];
        if (t->count == t->k && !(v > t->kth)) continue;
        if (v != v) continue;
        int64_t at = t->count < t->k ? t->count : t->k - 1;  // full: the k-th drops out
        while (at > 0 && t->values[at - 1] < v) {
            t->values[at] = t->values[at - 1];
            t->ids[at] = t->ids[at - 1];
            at--;
        }
        t->values[at] = v;
        t->ids[at] = i;
        if (t->count < t->k) t->count++;
        if (t->count == t->k) t->kth = t->values[t->k - 1];
    }
}

/* The k largest values of x (n,), largest first, ties in index order (k <= n). */
void pg_top_k(const float *x, int64_t n, int64_t k, int64_t *ids, float *values) {
    TopK t = {k, 0, ids, -INFINITY, values};
    for (int64_t start = 0; start < n; start += 64) top_k_block(&t, x, start, start + 64 < n ? start + 64 : n);
}

/* -sum p log p of logprobs[start .. start + count) (count <= 256): -inf terms 0, the terms added
 * in `sum`'s order. */
static inline float entropy_block(const float *logprobs, int64_t count) {
    float terms[256];
    for (int64_t i = 0; i < count; i++) {
        float lp = logprobs[i];
        terms[i] = lp > -INFINITY ? fast_expf(lp) * lp : 0.0f;
    }
    return sum(terms, count);
}

/* Entropy in nats of a distribution given by its logprobs (n,): -sum p log p, -inf terms 0
 * (terms computed a block of 256 at a time, then added in `sum`'s order). */
float pg_entropy(const float *logprobs, int64_t n) {
    float total = 0.0f;
    for (int64_t start = 0; start < n; start += 256)
        total += entropy_block(logprobs + start, n - start < 256 ? n - start : 256);
    return -total;
}

/* How many of x (n,) are greater than v. */
int64_t pg_count_greater(const float *x, int64_t n, float v) {
    int64_t count = 0;
    for (int64_t i = 0; i < n; i++) count += x[i] > v;
    return count;
}

/* A whole step's read-outs in one call (S rows of V): for each row whether it can be read (its
 * token inside the vocabulary and a finite processed logprob somewhere), the token's processed
 * and raw logprobs and its rank in the raw distribution, the raw distribution's entropy, and the
 * top `k` of the raw and (when `processed` is not NULL) the processed logprobs. The rows go over
 * the thread pool. One call rather than four per row: under the serving stack every call out of
 * Python gives up the GIL and waits to get it back behind the task threads. */
typedef struct {
    const float *raw, *processed;
    int64_t V, k;
    const int64_t *token_ids;
    int64_t *is_valid, *ranks, *top_raw_ids, *top_processed_ids;
    float *chosen, *entropies, *top_raw_values, *top_processed_values;
} ReadOutArgs;

static void read_out_task(void *ctx, int64_t i) {
    const ReadOutArgs *a = (const ReadOutArgs *)ctx;
    int64_t V = a->V, k = a->k, token_id = a->token_ids[i];
    const float *raw = a->raw + i * V;
    const float *processed = a->processed ? a->processed + i * V : raw;
    int64_t has_finite = 0;
    for (int64_t j = 0; j < V && !has_finite; j++) has_finite = isfinite(processed[j]);
    int64_t is_valid = has_finite && token_id >= 0 && token_id < V;
    a->is_valid[i] = is_valid;
    a->chosen[2 * i] = is_valid ? processed[token_id] : NAN;
    a->chosen[2 * i + 1] = is_valid ? raw[token_id] : NAN;
    // the raw row's rank, entropy and top k in one pass (pg_count_greater's, pg_entropy's and
    // pg_top_k's numbers): at 8 rows of a 152k vocabulary, three passes were 1.3 ms a step
    const float chosen_raw = is_valid ? raw[token_id] : INFINITY;
    TopK top = {k, 0, a->top_raw_ids + i * k, -INFINITY, a->top_raw_values + i * k};
    int64_t greater = 0;
    float total = 0.0f;
    for (int64_t start = 0; start < V; start += 256) {
        const int64_t end = start + 256 < V ? start + 256 : V;
        for (int64_t j = start; j < end; j++) greater += raw[j] > chosen_raw;
        total += entropy_block(raw + start, end - start);
        for (int64_t at = start; k > 0 && at < end; at += 64) top_k_block(&top, raw, at, at + 64 < end ? at + 64 : end);
    }
    a->ranks[i] = is_valid ? greater + 1 : 0;
    a->entropies[i] = -total;
    if (k <= 0) return;
    if (a->processed) pg_top_k(processed, V, k, a->top_processed_ids + i * k, a->top_processed_values + i * k);
}

void pg_read_outs(const float *raw, const float *processed, int64_t S, int64_t V, const int64_t *token_ids, int64_t k,
                  int64_t *is_valid, float *chosen, int64_t *ranks, float *entropies, int64_t *top_raw_ids,
                  float *top_raw_values, int64_t *top_processed_ids, float *top_processed_values, int num_threads) {
    ReadOutArgs a = {raw,    processed, V,           k,          token_ids,      is_valid,      ranks,
                     top_raw_ids, top_processed_ids, chosen, entropies, top_raw_values, top_processed_values};
    pg_parallel(S > 1 ? num_threads : 1, S, read_out_task, &a);
}

/* The index torch.argmax gives row x (V,): its first NaN if it has one, else the first of its
 * largest values. A vector pass finds the largest value (and any NaN), a scan its first place. */
static int64_t argmax_row(const float *x, int64_t V) {
    vf best = vsplat(-INFINITY);
    vi32 has_nan = {0};
    int64_t j = 0;
    for (; j + PG_VL <= V; j += PG_VL) {
        const vf v = vload(x + j);
        const vi32 is_greater = v > best;
        has_nan |= v != v;
        best = (vf)(((vi32)v & is_greater) | ((vi32)best & ~is_greater));
    }
    float peak = -INFINITY;
    int any_nan = 0;
    for (int l = 0; l < PG_VL; l++) {
        peak = best[l] > peak ? best[l] : peak;
        any_nan |= has_nan[l] != 0;
    }
    for (; j < V; j++) {
        peak = x[j] > peak ? x[j] : peak;
        any_nan |= x[j] != x[j];
    }
    for (j = 0; j < V; j++)
        if (any_nan ? x[j] != x[j] : x[j] == peak) return j;
    return 0;  // V == 0
}

typedef struct {
    const float *x;
    int64_t V;
    int64_t *ids;
} ArgmaxArgs;

static void argmax_task(void *ctx, int64_t i) {
    const ArgmaxArgs *a = (const ArgmaxArgs *)ctx;
    a->ids[i] = argmax_row(a->x + i * a->V, a->V);
}

/* Each of S rows' argmax (x (S, V) float32) into ids (S,), the rows over the thread pool: a
 * greedy step's choice, ~5x faster than torch's on 8 rows of a 49k vocabulary. */
void pg_argmax(const float *x, int64_t S, int64_t V, int64_t *ids, int num_threads) {
    ArgmaxArgs a = {x, V, ids};
    pg_parallel(S > 1 ? num_threads : 1, S, argmax_task, &a);
}
